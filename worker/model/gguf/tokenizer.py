"""tokenizer.json and tokenizer_config.json from a GGUF file's `tokenizer.*` metadata.

Byte-level BPE (`tokenizer.ggml.model` gpt2) only, which covers the Llama 3, Qwen and
SmolLM families; the pre-tokenizer follows `tokenizer.ggml.pre` as llama.cpp does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from worker.model.gguf.reader import field

# llama.cpp token types (llama_token_type): 3 control, 4 user defined.
_CONTROL, _USER_DEFINED = 3, 4

# GPT-2's split (contractions, letters, digits, other, spaces) and the Llama 3 / Qwen 2 ones.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": use_regex}


def _split(pattern: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
            "invert": False}


def pre_tokenizer(pre: str) -> dict[str, Any]:
    """The pre-tokenizer of llama.cpp's `tokenizer.ggml.pre` type."""
    if pre in ("gpt2", "default"):
        return _byte_level(True)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):  # each digit alone, then GPT-2
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, _byte_level(True)]}
    if pre in ("llama-bpe", "llama3"):
        return {"type": "Sequence", "pretokenizers": [_split(_LLAMA3_SPLIT), _byte_level(False)]}
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return {"type": "Sequence", "pretokenizers": [_split(_QWEN2_SPLIT), _byte_level(False)]}
    raise ValueError(f"GGUF tokenizer pre-tokenizer {pre!r} is not supported; supported: "
                     "gpt2, smollm, starcoder, llama-bpe, qwen2")


def _token_id(reader: GGUFReader, name: str) -> int | None:
    value = field(reader, f"tokenizer.ggml.{name}_token_id")
    return None if value is None else int(value)


def tokenizer_json(reader: GGUFReader) -> dict[str, Any]:
    """The tokenizers library's JSON for the file's vocabulary."""
    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"GGUF tokenizer model {model!r} is not supported (only byte-level "
                         "BPE, 'gpt2')")
    tokens: list[str] = field(reader, "tokenizer.ggml.tokens")
    types: list[int] = field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges: list[str] = field(reader, "tokenizer.ggml.merges") or []
    bos_id = _token_id(reader, "bos")
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False)) and bos_id is not None
    added = [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": types[i] == _CONTROL}
        for i in range(len(tokens)) if types[i] in (_CONTROL, _USER_DEFINED)
    ]
    if add_bos:
        bos = tokens[bos_id]
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos, "type_id": 1}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}
    else:
        post = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer(str(field(reader, "tokenizer.ggml.pre", "gpt2"))),
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {token: i for i, token in enumerate(tokens)},
                  "merges": [merge.split(" ", 1) for merge in merges]},
    }


def tokenizer_config(reader: GGUFReader) -> dict[str, Any]:
    """tokenizer_config.json: the special tokens' text and the chat template."""
    tokens: list[str] = field(reader, "tokenizer.ggml.tokens")

    def text(name: str) -> str | None:
        token_id = _token_id(reader, name)
        return tokens[token_id] if token_id is not None and token_id < len(tokens) else None

    return {
        "bos_token": text("bos"),
        "eos_token": text("eos"),
        "unk_token": text("unknown"),
        "pad_token": text("padding"),
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "chat_template": field(reader, "tokenizer.chat_template"),
    }


def write_tokenizer(reader: GGUFReader, out_dir: Path) -> None:
    """Writes tokenizer.json and tokenizer_config.json into out_dir."""
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer_json(reader),
                                                       ensure_ascii=False))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(reader),
                                                              indent=2, ensure_ascii=False))
