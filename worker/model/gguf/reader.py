"""A GGUF file's model description and tensors, under the Hugging Face Llama/Qwen layout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

# GGUF `general.architecture` -> the HF architecture the engine runs.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# The tensor types dequantized at load (gguf.quants covers them all; tested one by one).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q4_K", "Q5_K", "Q6_K")

# Per-layer tensor names: GGUF `blk.N.<key>` -> HF `model.layers.N.<value>`.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def open_gguf(path: str | Path) -> GGUFReader:
    """The memory-mapped file; ValueError naming the file when it is not a GGUF."""
    try:
        return GGUFReader(str(path), "r")
    except (ValueError, OSError) as err:
        raise ValueError(f"{path}: not a readable GGUF file ({err})") from None


def field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """A metadata value (str, int, float, bool or list), `default` when absent."""
    entry = reader.fields.get(key)
    return default if entry is None else entry.contents()


def architecture(reader: GGUFReader) -> str:
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: "
                         f"{', '.join(ARCHITECTURES)}")
    return arch


def hf_config(reader: GGUFReader) -> dict[str, Any]:
    """config.json of the checkpoint, from the `<arch>.*` and `tokenizer.ggml.*` metadata."""
    arch = architecture(reader)

    def meta(key: str, default: Any = None) -> Any:
        value = field(reader, f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}")
        return value

    if field(reader, f"{arch}.rope.scaling.type") not in (None, "none") or any(
            t.name == "rope_freqs.weight" for t in reader.tensors):
        raise ValueError("GGUF with RoPE scaling (rope_freqs / rope.scaling.*) is not supported")
    num_heads = int(meta("attention.head_count"))
    hidden = int(meta("embedding_length"))
    head_dim = int(field(reader, f"{arch}.attention.key_length") or hidden // num_heads)
    names = {t.name for t in reader.tensors}
    vocab_size = field(reader, f"{arch}.vocab_size") or len(field(reader, "tokenizer.ggml.tokens"))
    return {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": int(vocab_size),
        "hidden_size": hidden,
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", num_heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(meta("context_length")),
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }


def hf_name(gguf_name: str) -> str | None:
    """The HF name of a GGUF tensor, None for one the engine does not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order for Llama (it interleaves each head's two rotary
    halves for its GPT-J-style RoPE; HF keeps the halves apart, NeoX style).

    Rows [h, 2, d/2] in HF order were written as [h, d/2, 2]: swap them back.
    """
    rows = weight.shape[0]
    return (weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def dequantized(tensor: Any) -> np.ndarray:
    """A reader tensor as float32 (float16 kept as is), in row-major HF shape."""
    qtype = GGMLQuantizationType(tensor.tensor_type)
    if qtype.name not in SUPPORTED_TYPES:
        raise ValueError(f"tensor {tensor.name}: GGUF type {qtype.name} is not supported; "
                         f"supported: {', '.join(SUPPORTED_TYPES)}")
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dims fastest first
    if qtype == GGMLQuantizationType.F16:
        return np.asarray(tensor.data, dtype=np.float16).reshape(shape)
    return np.asarray(dequantize(tensor.data, qtype), dtype=np.float32).reshape(shape)


def hf_tensors(reader: GGUFReader, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, array) for each tensor the engine uses, dequantized, in HF row order."""
    permuted = config["model_type"] == "llama"
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        array = dequantized(tensor)
        if permuted and name.endswith("q_proj.weight"):
            array = unpermute_rows(array, config["num_attention_heads"])
        elif permuted and name.endswith("k_proj.weight"):
            array = unpermute_rows(array, config["num_key_value_heads"])
        yield name, array
