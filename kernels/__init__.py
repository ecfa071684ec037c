"""Attention and KV-cache-write ops: torch reference on CPU, Triton on CUDA."""

from kernels.ops import decode_attention, prefill_attention, write_kv

__all__ = ["decode_attention", "prefill_attention", "write_kv"]
