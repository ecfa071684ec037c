"""Triton KV-cache write: scatter each token's K and V rows into its paged slot."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    block_size,
    num_kv_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_HD: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    offs = tl.arange(0, BLOCK_HD)  # flattened (head, dim)
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    # A negative slot (padding or an already-cached token) stores nothing. The slot is
    # broadcast to a row first: the interpreter rejects a scalar-bool & tensor-bool mask.
    slot_row = slot + tl.zeros([BLOCK_HD], dtype=tl.int64)
    mask = (offs < num_kv_heads * HEAD_DIM) & (slot_row >= 0)
    k = tl.load(key_ptr + token * stride_kt + head * stride_kh + dim, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + head * stride_vh + dim, mask=mask)
    block_id = slot_row // block_size
    row = slot_row % block_size
    dst = block_id * stride_cb + row * stride_cs + head * stride_ch + dim
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Same contract as kernels.reference.write_kv."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert key.stride(2) == 1 and value.stride(2) == 1, "key/value last dim must be contiguous"
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.shape[1],
        num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_HD=triton.next_power_of_2(num_kv_heads * head_dim),
    )
