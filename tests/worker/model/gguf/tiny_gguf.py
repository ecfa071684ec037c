"""Small GGUF files written with gguf's own writer, for the reader and conversion tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from tokenizers import pre_tokenizers

# Two special tokens, then the 256 byte-level symbols, then two merges' results.
SPECIALS = ["<|endoftext|>", "<|im_end|>"]
BYTES = sorted(pre_tokenizers.ByteLevel.alphabet())
MERGES = ["Ġ t", "h e"]
TOKENS = SPECIALS + BYTES + ["Ġt", "he"]
LLAMA = dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, context=256)


def write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType | None]],
               arch: str = "llama", pre: str = "gpt2", add_bos: bool = False,
               tokens: list[str] = TOKENS, merges: list[str] = MERGES) -> Path:
    """A GGUF of `arch` with LLAMA's shape metadata, a tokenizer (TOKENS' unless `tokens`
    and `merges` are given; SPECIALS first in either) and `tensors` (name -> (array, raw
    GGML type of its bytes, None for a float array as is))."""
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(LLAMA["layers"])
    writer.add_context_length(LLAMA["context"])
    writer.add_embedding_length(LLAMA["hidden"])
    writer.add_feed_forward_length(LLAMA["ffn"])
    writer.add_head_count(LLAMA["heads"])
    writer.add_head_count_kv(LLAMA["kv_heads"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}")
    for name, (array, raw_type) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
