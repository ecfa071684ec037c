"""The embedded default model `tiny`: a small seeded random-weight Llama with the byte-level
tokenizer, generated on first use. Its text is noise by design; it exercises every path.

Generated without transformers (a dev-only dependency): weights go straight to
safetensors. The directory is built under a temporary name and renamed into place, so a
reader never sees a half-written checkpoint, even with several processes racing.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from worker.model.random_weights import llama_weight_shapes, random_tensor
from worker.model.staged_dir import build_dir_once
from worker.tokenizer.byte_tokenizer import (
    BOS_TOKEN_ID,
    BYTE_VOCAB_SIZE,
    END_OF_TURN_TOKEN_ID,
    EOS_TOKEN_ID,
    write_byte_tokenizer,
)
from worker.tokenizer.files import (
    TINY_MAX_POSITION_EMBEDDINGS,
    TINY_NAME,
    checkpoint_dir,
    default_cache_root,
)

TINY_SEED = 0
# Bump when the generated content changes, so stale caches are rebuilt.
_TINY_VERSION = "1"
_MARKER = ".kvroute-tiny-version"

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": BYTE_VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": TINY_MAX_POSITION_EMBEDDINGS,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": BOS_TOKEN_ID,
    "eos_token_id": EOS_TOKEN_ID,
    "torch_dtype": "float32",
}


def _write_tiny(model_dir: Path) -> None:
    gen = torch.Generator().manual_seed(TINY_SEED)
    shapes = llama_weight_shapes(TINY_CONFIG)
    tensors = {name: random_tensor(name, shapes[name], gen) for name in sorted(shapes)}
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    (model_dir / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2))
    generation = {
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": [EOS_TOKEN_ID, END_OF_TURN_TOKEN_ID],
    }
    (model_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    write_byte_tokenizer(model_dir, TINY_CONFIG["max_position_embeddings"])
    (model_dir / _MARKER).write_text(_TINY_VERSION)


def _is_complete(model_dir: Path) -> bool:
    marker = model_dir / _MARKER
    return marker.is_file() and marker.read_text() == _TINY_VERSION


def ensure_tiny(cache_dir: str | Path | None = None) -> Path:
    """The `tiny` checkpoint directory under cache_dir (default: default_cache_root()),
    generated there on first use. Deterministic: the same bytes on every machine."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    return build_dir_once(root / TINY_NAME, _write_tiny, _is_complete)


def resolve_model(name_or_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """'tiny' -> the embedded checkpoint (generated if needed); else an existing directory."""
    if str(name_or_path) == TINY_NAME:
        return ensure_tiny(cache_dir)
    return checkpoint_dir(name_or_path)
