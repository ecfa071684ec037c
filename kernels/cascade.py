"""Shared-prefix (cascade) decode attention: the torch reference path for CPU serving.

The prefix cache hands every request with the same prompt head the same KV blocks, so in a
decode batch their block tables start with identical block ids. Plain paged decode reads
that shared K/V once per request; here each group of requests reads it once:

    request a: | shared prefix: blocks 7 3 9 .. (P tokens) | a's own suffix |
    request b: | shared prefix: blocks 7 3 9 .. (P tokens) | b's own suffix     |
                 all queries of the group in one attention   one batched attention
                 -> (out_p, lse_p) per request                -> (out_s, lse_s)

    out = out_p * exp(lse_p - lse) + out_s * exp(lse_s - lse), lse = logaddexp(lse_p, lse_s)

which is exact: softmax over the whole sequence, split into two disjoint key sets and
merged by their log-sum-exp weights (FlashInfer's merge_state). Requests that share nothing
go through the plain reference decode. `plan_cascade` runs once per step on the host
(block tables do not change across layers); `cascade_decode_attention` runs per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kernels import reference


@dataclass(frozen=True)
class SharedPrefix:
    """Members plan.suffix_rows[first_member : first_member + num_members] (>= 2 requests)
    all read their first num_tokens positions from block_ids."""

    first_member: int
    num_members: int
    block_ids: torch.Tensor  # [ceil(num_tokens / block_size)] int64
    num_tokens: int


@dataclass(frozen=True)
class CascadePlan:
    """How one decode batch (N requests, one query each) reads the paged KV.

    block_tables, seq_lens: the batch the plan was built for (checked on every use).
    own_rows: [N_own] int64 requests with no shared prefix: plain decode.
    suffix_rows: [M] int64 requests with a shared prefix, grouped by prefix.
    suffix_block_tables: [M, max_suffix_blocks] int64, the blocks from the one holding the
        request's first unshared position to its last block (0-padded).
    suffix_first_pos: [M] int64 position of the first token of suffix_block_tables[:, 0].
    suffix_start: [M] int64 first position after the shared prefix.
    prefixes: the groups, in suffix_rows order.
    prefix_block_tables: [G, max_prefix_blocks] int64, group g's prefix blocks (0-padded).
    prefix_lens: [G] int64 tokens of each prefix.
    prefix_member_rows: [G, max_members] int64 members of each group as indices into
        suffix_rows, padded by repeating the group's first member.
    prefix_member_valid: [G, max_members] bool, False on padding. The valid entries in
        row-major order are 0 .. M - 1.

    The prefix level runs as one padded batch over the groups (a few large ops, not a few
    per group: on a busy CPU every parallel op can wait for a descheduled thread); the
    padding costs compute only where groups differ much in size or prefix length.
    """

    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    own_rows: torch.Tensor
    suffix_rows: torch.Tensor
    suffix_block_tables: torch.Tensor
    suffix_first_pos: torch.Tensor
    suffix_start: torch.Tensor
    prefixes: tuple[SharedPrefix, ...]
    prefix_block_tables: torch.Tensor
    prefix_lens: torch.Tensor
    prefix_member_rows: torch.Tensor
    prefix_member_valid: torch.Tensor

    @property
    def saved_kv_read_tokens(self) -> int:
        """K/V tokens per layer that plain decode would read and the groups do not."""
        return sum((p.num_members - 1) * p.num_tokens for p in self.prefixes)


def _common_prefix_tokens(a: np.ndarray, b: np.ndarray, len_a: int, len_b: int,
                          block_size: int) -> int:
    """Leading positions that rows a and b read from identical blocks (a, b: valid ids)."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    num_blocks = int(diff[0]) if diff.size else m
    return min(num_blocks * block_size, len_a, len_b)


def _choose_groups(lcp_tokens: np.ndarray, min_prefix_tokens: int) -> list[tuple[int, int, int]]:
    """Split requests in sorted order into groups that save the most K/V reads.

    lcp_tokens[j] is the shared prefix of sorted requests j and j + 1. A run lo..hi shares
    min(lcp_tokens[lo:hi]) = p tokens and saves (hi - lo) * p reads as one group; cutting
    it where lcp == p gives runs that each share more. Each run keeps whichever saves more
    (the run itself or its best split), bottom up. Returns (lo, hi, p) runs, hi > lo.
    """
    if lcp_tokens.size == 0:
        return []
    # Top down: the tree of runs, each node (lo, hi, p, children); parents come first.
    nodes: list[tuple[int, int, int, list[int]]] = []
    stack = [(0, lcp_tokens.size, -1)]
    while stack:
        lo, hi, parent = stack.pop()
        if hi == lo:
            continue  # a single request
        seg = lcp_tokens[lo:hi]
        p = int(seg.min())
        node_id = len(nodes)
        nodes.append((lo, hi, p, []))
        if parent >= 0:
            nodes[parent][3].append(node_id)
        cuts = (lo + np.flatnonzero(seg == p)).tolist()
        for start, end in zip([lo] + [c + 1 for c in cuts], cuts + [hi], strict=True):
            stack.append((start, end, node_id))
    # Bottom up: children have larger ids than their parent.
    saved = [0] * len(nodes)
    whole = [False] * len(nodes)
    for node_id in range(len(nodes) - 1, -1, -1):
        lo, hi, p, children = nodes[node_id]
        as_one = (hi - lo) * p if p >= min_prefix_tokens else 0
        split = sum(saved[c] for c in children)
        whole[node_id] = as_one > 0 and as_one >= split
        saved[node_id] = as_one if whole[node_id] else split
    chosen: list[tuple[int, int, int]] = []
    todo = [0]
    while todo:
        node_id = todo.pop()
        lo, hi, p, children = nodes[node_id]
        if whole[node_id]:
            chosen.append((lo, hi, p))
        else:
            todo.extend(children)
    return sorted(chosen)


def plan_cascade(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    min_prefix_tokens: int | None = None,
) -> CascadePlan:
    """Group the requests of a decode batch by the leading blocks they share.

    Args:
        block_tables: [N, max_blocks] block ids (CPU).
        seq_lens: [N] tokens per sequence, >= 1.
        block_size: tokens per KV block.
        min_prefix_tokens: the shortest prefix worth a group (default one block).
    """
    min_tokens = block_size if min_prefix_tokens is None else min_prefix_tokens
    if min_tokens < 1:
        raise ValueError(f"min_prefix_tokens must be >= 1, got {min_tokens}")
    tables = block_tables.cpu().numpy().astype(np.int64)
    lens = seq_lens.cpu().numpy().astype(np.int64)
    num_blocks = -(-lens // block_size)
    rows = [tables[i, : num_blocks[i]] for i in range(len(lens))]
    order = sorted(range(len(lens)), key=lambda i: tuple(rows[i].tolist()))
    lcp = np.array([
        _common_prefix_tokens(rows[a], rows[b], int(lens[a]), int(lens[b]), block_size)
        for a, b in zip(order, order[1:], strict=False)
    ], dtype=np.int64)

    prefixes: list[SharedPrefix] = []
    suffix_rows: list[int] = []
    grouped = np.zeros(len(lens), dtype=bool)
    for lo, hi, p in _choose_groups(lcp, min_tokens):
        members = order[lo : hi + 1]
        grouped[members] = True
        block_ids = torch.from_numpy(rows[members[0]][: -(-p // block_size)].copy())
        prefixes.append(SharedPrefix(len(suffix_rows), len(members), block_ids, p))
        suffix_rows += members
    starts = np.zeros(len(suffix_rows), dtype=np.int64)
    for prefix in prefixes:
        starts[prefix.first_member : prefix.first_member + prefix.num_members] = (
            prefix.num_tokens
        )
    width = max((len(p.block_ids) for p in prefixes), default=0)
    most = max((p.num_members for p in prefixes), default=0)
    prefix_tables = np.zeros((len(prefixes), width), dtype=np.int64)
    member_rows = np.zeros((len(prefixes), most), dtype=np.int64)
    member_valid = np.zeros((len(prefixes), most), dtype=bool)
    for g, prefix in enumerate(prefixes):
        prefix_tables[g, : len(prefix.block_ids)] = prefix.block_ids.numpy()
        member_rows[g] = prefix.first_member
        member_rows[g, : prefix.num_members] += np.arange(prefix.num_members)
        member_valid[g, : prefix.num_members] = True
    first_block = starts // block_size
    # At least one (masked) column: when every member's prefix is its whole sequence (two
    # fully cached copies of a prompt), the suffix level still has keys to reduce over.
    width = max([1] + [int(num_blocks[r] - f) for r, f in zip(suffix_rows, first_block,
                                                                strict=True)])
    suffix_tables = np.zeros((len(suffix_rows), width), dtype=np.int64)
    for m, (r, f) in enumerate(zip(suffix_rows, first_block, strict=True)):
        suffix_tables[m, : num_blocks[r] - f] = rows[r][f:]
    return CascadePlan(
        block_tables=block_tables,
        seq_lens=seq_lens,
        own_rows=torch.from_numpy(np.flatnonzero(~grouped)),
        suffix_rows=torch.tensor(suffix_rows, dtype=torch.int64),
        suffix_block_tables=torch.from_numpy(suffix_tables),
        suffix_first_pos=torch.from_numpy(first_block * block_size),
        suffix_start=torch.from_numpy(starts),
        prefixes=tuple(prefixes),
        prefix_block_tables=torch.from_numpy(prefix_tables),
        prefix_lens=torch.tensor([p.num_tokens for p in prefixes], dtype=torch.int64),
        prefix_member_rows=torch.from_numpy(member_rows),
        prefix_member_valid=torch.from_numpy(member_valid),
    )


def plan_single_query_rows(
    q_lens: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int
) -> CascadePlan | None:
    """The plan for the requests with one new token (q_lens [N] == 1), in batch order, which
    kernels.reference.prefill_attention serves in one decode call (or a decode-only batch);
    None when fewer than two requests have one."""
    single = (q_lens == 1).nonzero().squeeze(1)
    if single.numel() < 2:
        return None
    return plan_cascade(block_tables[single], seq_lens[single], block_size)


def merge_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over key sets A and B from each one's normalized output [.., D] and
    log-sum-exp [..] (natural log, -inf for an empty set; not both empty)."""
    lse = torch.logaddexp(lse_a, lse_b)
    out = out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[..., None]
    return out, lse


def _softmax_states(scores: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [.., R, S] (already scaled; masked keys -inf; overwritten), v [.., S, D] ->
    out [.., R, D], lse [.., R]. A row with every key masked gets out 0 and lse -inf."""
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
    probs = scores.sub_(row_max).exp_()
    denom = probs.sum(dim=-1)  # [.., R]
    out = (probs @ v) / torch.where(denom > 0, denom, 1.0)[..., None]
    return out, row_max.squeeze(-1) + torch.log(denom)


def _gather_head_major(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """cache [num_blocks, block_size, Hkv, D], block_ids [R, B] int64 -> fp32
    [Hkv, R, B * block_size, D]: each head's keys contiguous, so the matmuls below read K^T
    and V in place (gathering token-major and permuting would copy everything twice)."""
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    rows, width = block_ids.shape
    out = torch.empty(num_kv_heads, rows * width, block_size, head_dim, dtype=cache.dtype,
                      device=cache.device)
    flat_ids = block_ids.reshape(-1)
    for h in range(num_kv_heads):
        torch.index_select(cache.select(2, h), 0, flat_ids, out=out[h])
    return out.view(num_kv_heads, rows, width * block_size, head_dim).float()


def _prefix_states(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   plan: CascadePlan, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [M, Hq, D] fp32 of the grouped requests (suffix_rows order) against their group's
    shared prefix, each prefix read once: returns out [M, Hq, D], lse [M, Hq]."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    tables = plan.prefix_block_tables.to(k_cache.device)
    num_groups, most = plan.prefix_member_rows.shape
    # A group's queries of one KV head are rows of one matrix: [Hkv, G, most * group, D].
    qg = q[plan.prefix_member_rows.to(q.device)] * scale  # [G, most, Hq, D]
    qg = qg.view(num_groups, most, num_kv_heads, group, head_dim).permute(2, 0, 1, 3, 4)
    qg = qg.reshape(num_kv_heads, num_groups, most * group, head_dim)
    k = _gather_head_major(k_cache, tables)  # [Hkv, G, P, D]
    v = _gather_head_major(v_cache, tables)
    scores = qg @ k.transpose(-1, -2)  # [Hkv, G, most * group, P]
    positions = torch.arange(tables.shape[1] * block_size, device=q.device)
    valid = positions[None, :] < plan.prefix_lens.to(q.device)[:, None]  # [G, P]
    scores.masked_fill_(~valid[None, :, None], float("-inf"))
    out, lse = _softmax_states(scores, v)
    out = out.view(num_kv_heads, num_groups, most, group, head_dim).permute(1, 2, 0, 3, 4)
    lse = lse.view(num_kv_heads, num_groups, most, group).permute(1, 2, 0, 3)
    keep = plan.prefix_member_valid.to(q.device).reshape(-1)
    out = out.reshape(num_groups * most, num_heads, head_dim)[keep]
    return out, lse.reshape(num_groups * most, num_heads)[keep]


def _suffix_states(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   plan: CascadePlan, seq_lens: torch.Tensor, scale: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [M, Hq, D] fp32 of the grouped requests against their own positions
    suffix_start .. seq_len - 1; seq_lens [M]."""
    m, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    tables = plan.suffix_block_tables.to(k_cache.device)
    k = _gather_head_major(k_cache, tables)  # [Hkv, M, S, D]
    v = _gather_head_major(v_cache, tables)
    positions = plan.suffix_first_pos.to(q.device)[:, None] + torch.arange(
        tables.shape[1] * block_size, device=q.device)
    valid = (positions >= plan.suffix_start.to(q.device)[:, None]) & (
        positions < seq_lens.to(q.device)[:, None])  # [M, S]
    qh = (q * scale).view(m, num_kv_heads, group, head_dim).transpose(0, 1)  # [Hkv, M, g, D]
    scores = qh @ k.transpose(-1, -2)  # [Hkv, M, group, S]
    scores.masked_fill_(~valid[None, :, None], float("-inf"))
    out, lse = _softmax_states(scores, v)
    out = out.transpose(0, 1).reshape(m, num_heads, head_dim)
    return out, lse.transpose(0, 1).reshape(m, num_heads)


def cascade_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    plan: CascadePlan,
) -> torch.Tensor:
    """kernels.reference.decode_attention, reading shared prefixes once per group.

    plan must come from plan_cascade over these block_tables and seq_lens (ValueError
    otherwise). Returns [N, Hq, D] in q.dtype.
    """
    if not (torch.equal(plan.seq_lens, seq_lens) and torch.equal(plan.block_tables,
                                                                 block_tables)):
        raise ValueError("the cascade plan was built for another batch")
    out = torch.empty_like(q)
    own = plan.own_rows.to(q.device)
    if own.numel():
        out[own] = reference.decode_attention(q[own], k_cache, v_cache, block_tables[own],
                                              seq_lens[own], scale)
    if not plan.prefixes:
        return out
    rows = plan.suffix_rows.to(q.device)
    qs = q[rows].float()
    out_s, lse_s = _suffix_states(qs, k_cache, v_cache, plan, seq_lens[rows], scale)
    out_p, lse_p = _prefix_states(qs, k_cache, v_cache, plan, scale)
    merged, _ = merge_states(out_p, lse_p, out_s, lse_s)
    out[rows] = merged.to(q.dtype)
    return out
