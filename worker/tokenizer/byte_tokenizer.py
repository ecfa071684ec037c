"""The byte-level tokenizer of the embedded `tiny` model and of random test checkpoints.

Token id b (0..255) is byte b, so any UTF-8 text round-trips; the specials follow:

    256 <s>   257 </s>   258 <|system|>   259 <|user|>   260 <|assistant|>   261 <|end|>

Encoding prepends <s>, as Llama tokenizers do. A chat turn renders as
"<|role|>\\ncontent<|end|>\\n"; generation stops at </s> or <|end|>.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

SPECIAL_TOKENS = ("<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
BOS_TOKEN_ID = 256
EOS_TOKEN_ID = 257
END_OF_TURN_TOKEN_ID = 261
BYTE_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _byte_alphabet() -> dict[int, str]:
    """The byte -> printable character map of byte-level BPE (bytes that are already
    printable keep their code point; the rest move to 256 onwards, in byte order)."""
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    }
    alphabet, num_moved = {}, 0
    for b in range(256):
        if b in printable:
            alphabet[b] = chr(b)
        else:
            alphabet[b] = chr(256 + num_moved)
            num_moved += 1
    return alphabet


def build_byte_tokenizer() -> Tokenizer:
    vocab = {char: b for b, char in _byte_alphabet().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_TOKEN_ID)]
    )
    return tokenizer


def write_byte_tokenizer(model_dir: Path, model_max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json (with the chat template) into model_dir."""
    (model_dir / "tokenizer.json").write_text(build_byte_tokenizer().to_str(pretty=True))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "add_bos_token": True,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
