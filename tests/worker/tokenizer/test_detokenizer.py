"""The incremental detokenizer: its deltas add up to decoding the whole output, byte-level
tokens that split a UTF-8 character are held back, and stop strings cut the text."""

import random

from tokenizers import Tokenizer

from worker.tokenizer.detokenizer import IncrementalDetokenizer
from worker.tokenizer.files import load_tokenizer_files, tokenizer_dir


def _tokenizer():
    return Tokenizer.from_file(str(load_tokenizer_files(tokenizer_dir("tiny")).tokenizer_path))


def _run(tok, ids, stop=(), min_tokens=0):
    detok = IncrementalDetokenizer(tok, stop, min_tokens)
    deltas = []
    for n in range(1, len(ids) + 1):
        delta, hit = detok.step(ids[:n], final=n == len(ids))
        deltas.append(delta)
        if hit:
            return "".join(deltas), True
    return "".join(deltas), False


def test_deltas_add_up_to_the_whole_decode():
    tok = _tokenizer()
    rng = random.Random(0)
    text = "Grüße, 世界! 🎉 plain ascii and more: ñ"
    for ids in (tok.encode(text, add_special_tokens=False).ids,
                [rng.randrange(3, 259) for _ in range(300)]):
        out, hit = _run(tok, ids)
        assert not hit
        assert out == tok.decode(ids, skip_special_tokens=True)


def test_a_split_character_is_held_until_complete():
    tok = _tokenizer()
    ids = tok.encode("é", add_special_tokens=False).ids
    assert len(ids) > 1  # byte-level: two tokens for one character
    detok = IncrementalDetokenizer(tok)
    assert detok.step(ids[:1], final=False) == ("", False)
    assert detok.step(ids, final=False) == ("é", False)


def test_stop_strings_cut_the_text():
    tok = _tokenizer()
    ids = tok.encode("hello world, STOP here", add_special_tokens=False).ids
    assert _run(tok, ids, stop=("STOP",)) == ("hello world, ", True)


def test_min_tokens_lets_no_stop_string_end_the_output_before_it():
    tok = _tokenizer()
    ids = tok.encode("ab.cd.ef", add_special_tokens=False).ids  # one token a byte
    assert _run(tok, ids, (".",)) == ("ab", True)
    assert _run(tok, ids, (".",), min_tokens=3) == ("ab.cd", True)  # the "." at token 3
    assert _run(tok, ids, (".",), min_tokens=8) == ("ab.cd.ef", False)
