"""Dispatch each op to Triton for CUDA tensors and to the torch reference elsewhere.

The Triton modules are imported on first CUDA use only: CPU serving works without triton
installed, and tests can set TRITON_INTERPRET before any kernel is defined.

Decode attention takes an optional kernels.cascade.CascadePlan: on CPU the requests that
share leading blocks read them once (kernels.cascade); the Triton decode kernel ignores it
and reads every request's blocks (its reads are cheap next to the reference's gathers).
"""

from __future__ import annotations

import importlib
from functools import partial
from types import ModuleType

import torch

from kernels import cascade, reference

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
    decode_plan: cascade.CascadePlan | None = None,
) -> torch.Tensor:
    """Causal paged attention of packed new tokens; see kernels.reference.prefill_attention.

    decode_plan: on CPU, a cascade plan over the requests with a single query (in batch
    order), from kernels.cascade.plan_single_query_rows.
    """
    if q.is_cuda:
        return _triton("prefill_attention").prefill_attention(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, max_query_len
        )
    decode = reference.decode_attention
    if decode_plan is not None:
        decode = partial(cascade.cascade_decode_attention, plan=decode_plan)
    return reference.prefill_attention(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, max_query_len, decode
    )


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    plan: cascade.CascadePlan | None = None,
) -> torch.Tensor:
    """Paged attention of one query per request; see kernels.reference.decode_attention.

    plan: on CPU, kernels.cascade.plan_cascade over these block tables and lengths.
    """
    if q.is_cuda:
        return _triton("decode_attention").decode_attention(
            q, k_cache, v_cache, block_tables, seq_lens, scale
        )
    if plan is not None:
        return cascade.cascade_decode_attention(
            q, k_cache, v_cache, block_tables, seq_lens, scale, plan
        )
    return reference.decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)
