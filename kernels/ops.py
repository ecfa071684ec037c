"""Dispatch each op to Triton for CUDA tensors and to the torch reference elsewhere.

The Triton modules are imported on first CUDA use only: CPU serving works without triton
installed, and tests can set TRITON_INTERPRET before any kernel is defined.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from kernels import reference

_TRITON_MODULES = {
    "write_kv": "kernels.triton_kv_write",
    "decode_attention": "kernels.triton_decode_attention",
    "prefill_attention": "kernels.triton_prefill_attention",
}


def _triton(op: str) -> ModuleType:
    return importlib.import_module(_TRITON_MODULES[op])


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store key/value [T, Hkv, D] into the paged caches at slot_mapping [T]; -1 skips."""
    impl = _triton("write_kv") if key.is_cuda else reference
    impl.write_kv(key, value, k_cache, v_cache, slot_mapping)


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
) -> torch.Tensor:
    """Causal paged attention of packed new tokens; see kernels.reference.prefill_attention."""
    impl = _triton("prefill_attention") if q.is_cuda else reference
    return impl.prefill_attention(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, max_query_len
    )


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Paged attention of one query per request; see kernels.reference.decode_attention."""
    impl = _triton("decode_attention") if q.is_cuda else reference
    return impl.decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)
