"""The pre-tokenizers a GGUF's `tokenizer.ggml.pre` names (gpt2, llama-bpe, qwen2) split
text as transformers' reading of the same file does. The merges join pieces across the
places where the three splits differ (digit runs, a leading space or symbol, upper-case
contractions, a newline after punctuation, whitespace runs before a newline), so a wrong
split changes the token ids. (`smollm` is checked against the real file: transformers
gives it GPT-2's split, which SmolLM2's vocabulary, holding single digits only, hides.)"""

import pytest
from tokenizers import Tokenizer

from tests.worker.model.gguf.tiny_gguf import BYTES, SPECIALS, write_gguf
from worker.model.gguf.convert import gguf_tokenizer_dir

MERGES = ["1 2", "12 3", "4 5", "Ġ 1", "Ġ a", "$ a", "' S", "! Ċ", "Ċ Ċ", "Ġ Ġ", "ĠĠ Ċ",
          "a b", "Ġ 4"]
TOKENS = SPECIALS + BYTES + [merge.replace(" ", "") for merge in MERGES]
TEXTS = ["12345", "x 12345", "$ab", "IT'S it's", "hi!\nyo", "a  \n\nb", "  \n ab ",
         "ab 45 ab", "<|im_end|>12 $a"]
PRES = ("gpt2", "llama-bpe", "qwen2")


def encodings(tmp_path, pre: str) -> tuple[list[list[int]], list[list[int]]]:
    """(ours, transformers') token ids of each text."""
    from transformers import AutoTokenizer

    path = write_gguf(tmp_path / f"{pre}.gguf", {}, pre=pre, tokens=TOKENS, merges=MERGES)
    ours = Tokenizer.from_file(str(gguf_tokenizer_dir(path, tmp_path / f"cache-{pre}") /
                                   "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    return ([ours.encode(t).ids for t in TEXTS],
            [hf.encode(t, add_special_tokens=False) for t in TEXTS])


@pytest.mark.parametrize("pre", PRES)
def test_the_split_equals_transformers_gguf_tokenizer(tmp_path, pre):
    ours, expected = encodings(tmp_path, pre)
    assert [[TOKENS[i] for i in ids] for ids in ours] == [
        [TOKENS[i] for i in ids] for ids in expected]


def test_the_texts_tell_the_three_splits_apart(tmp_path):
    ours = [encodings(tmp_path, pre)[0] for pre in PRES]
    assert ours[0] != ours[1] and ours[1] != ours[2] and ours[0] != ours[2]
