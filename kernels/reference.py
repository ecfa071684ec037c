"""Torch reference for every kernel: the CPU path and the correctness oracle for Triton.

Paged KV layout shared by all ops (per layer):

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    token at position p of a request lives in block block_table[p // block_size],
    row p % block_size; its slot is block_id * block_size + p % block_size.

Attention math runs in fp32 whatever the cache dtype, and the result is cast back to the
dtype of q. Block-table entries past a request's last block are never read (the reference
clamps them so any padding value is safe to gather).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store key/value [T, Hkv, D] at slot_mapping [T] (int64); a negative slot is skipped."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if slot_mapping.numel() and int(slot_mapping.min()) >= 0:
        # Every token is written (any decode step): one copy per cache, none of the masking
        # below, which is most of a decode layer's KV write.
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping,
                                                             value.to(v_cache.dtype))
        return
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, num_kv_heads, head_dim)[slots] = key[keep].to(k_cache.dtype)
    v_cache.view(-1, num_kv_heads, head_dim)[slots] = value[keep].to(v_cache.dtype)


def _gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[N, max_blocks] block ids -> [N, num_tokens, Hkv, D] contiguous fp32 K or V."""
    num_blocks = cache.shape[0]
    n = block_tables.shape[0]
    ids = block_tables.long().clamp(0, num_blocks - 1)
    blocks_needed = -(-num_tokens // cache.shape[1])
    gathered = gather_blocks(cache, ids[:, :blocks_needed])  # [N, blocks, block_size, Hkv, D]
    gathered = gathered.reshape(n, -1, cache.shape[2], cache.shape[3])
    return gathered[:, :num_tokens].float()


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """cache [num_blocks, ...] rows at block_ids [...] (int64, in range): [*block_ids.shape,
    ...]. index_select, not advanced indexing: on CPU it copies whole blocks and is several
    times faster (advanced indexing walks element by element)."""
    rows = cache.index_select(0, block_ids.reshape(-1))
    return rows.view(*block_ids.shape, *cache.shape[1:])


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Masked softmax attention with GQA, through torch's fused SDPA (no [.., M, S] score
    tensor is materialized per head group by us; CPU and CUDA both have fused kernels).

    q [N, M, Hq, D], k/v [N, S, Hkv, D] fp32, mask [N, M, S] (True = attend; None: all).
    Returns [N, M, Hq, D] fp32.
    """
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=None if mask is None else mask[:, None], scale=scale, enable_gqa=True,
    )  # [N, Hq, M, D]
    return out.transpose(1, 2)


# Plain decode gathers each request's K/V into one padded tensor; a chunk of requests at a
# time keeps that tensor a few MB (one 100+ MB gather per layer costs more in fresh pages
# than in copying).
_DECODE_CHUNK_TOKENS = 16384


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per request attending to its whole sequence.

    Args:
        q: [N, Hq, D], the query of each request's last token.
        block_tables: [N, max_blocks] int32.
        seq_lens: [N] int32, tokens in each sequence (>= 1, the new token's KV included).
    Returns:
        [N, Hq, D] in q.dtype.
    """
    max_len = int(seq_lens.max())
    chunk = max(1, _DECODE_CHUNK_TOKENS // max_len)
    if q.shape[0] > chunk:
        return torch.cat([
            decode_attention(q[i : i + chunk], k_cache, v_cache, block_tables[i : i + chunk],
                             seq_lens[i : i + chunk], scale)
            for i in range(0, q.shape[0], chunk)
        ])
    k = _gather_kv(k_cache, block_tables, max_len)
    v = _gather_kv(v_cache, block_tables, max_len)
    mask = None  # every sequence as long as the longest (one request): nothing to mask
    if int(seq_lens.min()) < max_len:
        positions = torch.arange(max_len, device=q.device)
        mask = (positions[None, :] < seq_lens.to(q.device)[:, None])[:, None, :]  # [N, 1, S]
    out = _attend(q.float()[:, None], k, v, mask, scale)
    return out[:, 0].to(q.dtype)


DecodeFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    decode: DecodeFn = decode_attention,
) -> torch.Tensor:
    """Causal attention for the new tokens of each request over its cached context.

    Request i owns rows cu_seqlens_q[i]:cu_seqlens_q[i+1] of q: the queries of its last
    q_len_i positions out of seq_lens[i]. All K/V (cached context and the new tokens) are
    read from the paged cache.

        positions: 0 ............ ctx_len-1 | ctx_len ........ seq_len-1
                   cached context (no query) | new tokens: one query each

    Args:
        q: [T, Hq, D] packed over requests.
        block_tables: [N, max_blocks] int32.
        cu_seqlens_q: [N + 1] int32 prefix sums of query lengths.
        seq_lens: [N] int32 (>= q_len_i).
        max_query_len: a launch hint for the Triton kernel; unused here.
        decode: serves the requests with a single query, all in one call, when there are
            several (args as decode_attention's, over those requests in batch order).
    Returns:
        [T, Hq, D] in q.dtype.
    """
    out = torch.empty_like(q)
    starts = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    # Mixed batches are mostly decodes: one batched decode call serves every request with a
    # single query, and only the real prefill chunks take the per-request loop below.
    q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    single = (q_lens == 1).nonzero().squeeze(1)
    if single.numel() > 1:
        rows = cu_seqlens_q[:-1].long()[single]
        out[rows] = decode(q[rows], k_cache, v_cache, block_tables[single], seq_lens[single],
                           scale)
    batched = set(single.tolist()) if single.numel() > 1 else set()
    for i, seq_len in enumerate(lens):
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start
        if q_len == 0 or i in batched:
            continue
        k = _gather_kv(k_cache, block_tables[i : i + 1], seq_len)
        v = _gather_kv(v_cache, block_tables[i : i + 1], seq_len)
        query_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        key_pos = torch.arange(seq_len, device=q.device)
        mask = (key_pos[None, :] <= query_pos[:, None])[None]  # [1, M, S]
        res = _attend(q[q_start:q_end].float()[None], k, v, mask, scale)
        out[q_start:q_end] = res[0].to(q.dtype)
    return out
