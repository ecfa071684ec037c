"""Triton paged prefill attention: new tokens of each request over cached context + themselves.

One program per (request, q head, tile of BLOCK_M new tokens). Keys and values, cached
context and new tokens alike, are read from the paged cache (the new K/V was written
before the call), so prefix-cache hits and chunked prefill need no special path:

    key positions:   0 ................ ctx_len ......................... seq_len
                     |  cached context  |  new tokens (queries)            |
    query tile m:                       |<- rows m*BLOCK_M .. +BLOCK_M ->|
    keys visited:    0 ... up to ctx_len + (m+1)*BLOCK_M (causal bound), tile by tile

Rows past a request's query length are computed but not stored; a tile past it visits no
keys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_decode_attention import dot_precision

_LOG2E = 1.4426950408889634
_BLOCK_M = 32
_BLOCK_N = 32


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    cu_seqlens_q_ptr,
    seq_lens_ptr,
    out_ptr,
    qk_scale,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    stride_cb,
    stride_cs,
    stride_ch,
    block_size,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    m_tile = tl.program_id(2)
    kv_head = head // GROUP
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len

    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    q_pos = ctx_len + offs_m

    kv_end = tl.minimum(seq_len, ctx_len + (m_tile + 1) * BLOCK_M)
    kv_end = tl.where(m_tile * BLOCK_M < q_len, kv_end, 0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for tile_start in range(0, kv_end, BLOCK_N):
        pos = tile_start + offs_n
        n_mask = pos < kv_end
        block_ids = tl.load(
            block_tables_ptr + seq * stride_bt + pos // block_size, mask=n_mask, other=0
        ).to(tl.int64)
        kv_off = block_ids * stride_cb + (pos % block_size) * stride_cs + kv_head * stride_ch
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [M, N]
        # Key 0 is visible to every row, so each row's running max is finite after tile 0.
        visible = (pos[None, :] <= q_pos[:, None]) & n_mask[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


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
    """Same contract as kernels.reference.prefill_attention.

    max_query_len sizes the grid; pass it when known on the host, else it is read from
    cu_seqlens_q (a device-to-host sync).
    """
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads = k_cache.shape[2]
    assert q.stride(2) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    out = torch.empty_like(q)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len is None:
        max_query_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    grid = (num_seqs, num_heads, triton.cdiv(max_query_len, _BLOCK_M))
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        seq_lens,
        out,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.shape[1],
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_M=_BLOCK_M,
        BLOCK_N=_BLOCK_N,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=dot_precision(q.dtype),
    )
    return out
