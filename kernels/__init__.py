"""Attention and KV-cache-write ops: torch reference on CPU, Triton on CUDA."""

from kernels.cascade import CascadePlan, plan_cascade, plan_single_query_rows
from kernels.ops import decode_attention, prefill_attention, write_kv

__all__ = [
    "CascadePlan",
    "decode_attention",
    "plan_cascade",
    "plan_single_query_rows",
    "prefill_attention",
    "write_kv",
]
