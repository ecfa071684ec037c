"""Triton paged decode attention: one query per request, split over KV, online softmax.

Stage 1 runs one program per (request, kv head, split). The program holds the queries of
all q heads of its GQA group ([BLOCK_G, D], padded to the 16 rows tl.dot needs), so each
K/V tile is read once per group, and walks its split of the sequence tile by tile with
an online (running max) softmax. It writes its normalized partial output and its
log-sum-exp; stage 2 merges the splits of each (request, q head) by their weights.

    sequence tokens: |<- split 0 ->|<- split 1 ->| ... |<- split S-1 ->|
                       tiles of BLOCK_N tokens; a tile may span several KV blocks
                       (each token's block id comes from the block table)

Splits past a request's length are empty and write lse = -inf, which stage 2 ignores.
The number of splits comes from block_tables.shape[1] (an upper bound on every length),
so launching needs no device-to-host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
_BLOCK_N = 32
_TARGET_PROGRAMS = 512
_MAX_SPLITS = 64  # the merge kernel holds [splits, head_dim] partials in registers


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,  # [N, Hq, S, D] fp32
    lse_ptr,  # [N, Hq, S] fp32, base 2
    qk_scale,  # softmax scale * log2(e)
    stride_qn,
    stride_qh,
    stride_bt,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_on,
    stride_oh,
    stride_os,
    stride_ln,
    stride_lh,
    block_size,
    tokens_per_split,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q_mask = g_mask[:, None] & d_mask[None, :]
    q = tl.load(
        q_ptr + seq * stride_qn + heads[:, None] * stride_qh + offs_d[None, :],
        mask=q_mask,
        other=0.0,
    )  # [BLOCK_G, BLOCK_D]

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for tile_start in range(start, end, BLOCK_N):
        pos = tile_start + offs_n
        n_mask = pos < end
        block_ids = tl.load(
            block_tables_ptr + seq * stride_bt + pos // block_size, mask=n_mask, other=0
        ).to(tl.int64)
        kv_off = block_ids * stride_cb + (pos % block_size) * stride_cs + kv_head * stride_ch
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [G, N]
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))
    out_off = seq * stride_on + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :]
    tl.store(out_ptr + out_off, out, mask=q_mask)
    tl.store(lse_ptr + seq * stride_ln + heads * stride_lh + split, lse, mask=g_mask)


@triton.jit
def _decode_merge_kernel(
    part_ptr,  # [N, Hq, S, D] fp32
    lse_ptr,  # [N, Hq, S] fp32
    out_ptr,  # [N, Hq, D]
    stride_pn,
    stride_ph,
    stride_ps,
    stride_ln,
    stride_lh,
    stride_on,
    stride_oh,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    lse = tl.load(
        lse_ptr + seq * stride_ln + head * stride_lh + offs_s, mask=s_mask, other=float("-inf")
    )
    # Split 0 always holds the first token, so the max is finite.
    weights = tl.exp2(lse - tl.max(lse, 0))  # [S]
    part = tl.load(
        part_ptr
        + seq * stride_pn
        + head * stride_ph
        + offs_s[:, None] * stride_ps
        + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    out = tl.sum(part * weights[:, None], 0) / tl.sum(weights, 0)
    tl.store(
        out_ptr + seq * stride_on + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def _tokens_per_split(num_seqs: int, num_kv_heads: int, max_tokens: int) -> int:
    """Enough splits to fill the GPU for small batches; whole BLOCK_N tiles per split."""
    splits_wanted = min(_MAX_SPLITS, max(1, _TARGET_PROGRAMS // (num_seqs * num_kv_heads)))
    tokens = triton.cdiv(max_tokens, splits_wanted)
    return max(_BLOCK_N, triton.cdiv(tokens, _BLOCK_N) * _BLOCK_N)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 products; tf32 would break the fp32 oracle tolerance."""
    return "ieee" if dtype == torch.float32 else "tf32"


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as kernels.reference.decode_attention."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    assert q.stride(2) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    max_tokens = block_tables.shape[1] * k_cache.shape[1]
    tokens_per_split = _tokens_per_split(num_seqs, num_kv_heads, max_tokens)
    num_splits = triton.cdiv(max_tokens, tokens_per_split)
    part = torch.empty(
        num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
    )
    lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    block_d = max(16, triton.next_power_of_2(head_dim))
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        part,
        lse,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        part.stride(0),
        part.stride(1),
        part.stride(2),
        lse.stride(0),
        lse.stride(1),
        k_cache.shape[1],
        tokens_per_split,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=_BLOCK_N,
        BLOCK_D=block_d,
        DOT_PRECISION=dot_precision(q.dtype),
    )
    _decode_merge_kernel[(num_seqs, num_heads)](
        part,
        lse,
        out,
        part.stride(0),
        part.stride(1),
        part.stride(2),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        num_splits,
        HEAD_DIM=head_dim,
        BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_D=block_d,
    )
    return out
