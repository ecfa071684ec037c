"""Cascade (shared-prefix) decode attention against the plain reference decode."""

from __future__ import annotations

import math

import pytest
import torch

from kernels import cascade, ops, reference

BLOCK_SIZE, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 8, 2, 16
SCALE = 1 / math.sqrt(HEAD_DIM)


def pool(num_blocks: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def batch(tables: list[list[int]], seq_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """0-padded [N, max_blocks] int32 tables (one spare column) and [N] int32 lengths."""
    width = max(len(t) for t in tables) + 1
    bt = torch.zeros(len(tables), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return bt, torch.tensor(seq_lens, dtype=torch.int32)


def queries(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, NUM_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(seed))


def check_equal_to_plain(tables: list[list[int]], seq_lens: list[int]) -> cascade.CascadePlan:
    k_cache, v_cache = pool()
    bt, lens = batch(tables, seq_lens)
    q = queries(len(tables))
    plan = cascade.plan_cascade(bt, lens, BLOCK_SIZE)
    got = cascade.cascade_decode_attention(q, k_cache, v_cache, bt, lens, SCALE, plan)
    want = reference.decode_attention(q, k_cache, v_cache, bt, lens, SCALE)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    return plan


def test_groups_with_ragged_suffixes_and_a_loner():
    # Rows 0, 2, 3 share blocks 5 6 7 (12 tokens); row 1 shares nothing; rows 4, 5 share
    # block 9 only. Suffixes end mid-block, on a block boundary, and one block in.
    tables = [[5, 6, 7, 10, 11], [1, 2, 3], [5, 6, 7, 12], [5, 6, 7, 13, 14, 15], [9, 20],
              [9, 21, 22]]
    seq_lens = [18, 10, 16, 21, 5, 11]
    plan = check_equal_to_plain(tables, seq_lens)
    assert [(p.num_members, p.num_tokens, p.block_ids.tolist()) for p in plan.prefixes] == [
        (3, 12, [5, 6, 7]), (2, 4, [9])]
    assert plan.suffix_rows.tolist() == [0, 2, 3, 4, 5]
    assert plan.own_rows.tolist() == [1]
    assert plan.suffix_start.tolist() == [12, 12, 12, 4, 4]
    assert plan.saved_kv_read_tokens == 2 * 12 + 4


def test_no_sharing_is_plain_decode():
    plan = check_equal_to_plain([[1, 2], [3], [4, 5, 6]], [7, 2, 12])
    assert plan.prefixes == () and plan.own_rows.tolist() == [0, 1, 2]


def test_all_sharing_including_a_request_with_no_own_suffix():
    # Every request reads blocks 3 4 first; the last one ends exactly where the prefix does
    # (a fully cached prompt's decode): its own part is empty and merges with weight 0.
    tables = [[3, 4, 8], [3, 4, 9, 10], [3, 4]]
    plan = check_equal_to_plain(tables, [9, 13, 8])
    assert [(p.num_members, p.num_tokens) for p in plan.prefixes] == [(3, 8)]
    assert plan.own_rows.tolist() == []


def test_identical_requests_have_no_own_suffix_at_all():
    # Two fully cached copies of one prompt compute its last token in the same step.
    plan = check_equal_to_plain([[3, 4, 5], [3, 4, 5], [6]], [12, 12, 3])
    assert [(p.num_members, p.num_tokens) for p in plan.prefixes] == [(2, 12)]
    assert plan.suffix_block_tables.tolist() == [[0], [0]]


def test_prefix_is_cut_at_the_shortest_member_inside_a_shared_block():
    # Both tables hold block 2 at index 1, but row 1 ends 2 tokens into it: the group shares
    # 6 tokens, and row 0 reads the rest of block 2 as its own suffix.
    plan = check_equal_to_plain([[1, 2, 3], [1, 2]], [11, 6])
    assert [(p.num_tokens, p.block_ids.tolist()) for p in plan.prefixes] == [(6, [1, 2])]
    assert plan.suffix_first_pos.tolist() == [4, 4]


def test_nested_sharing_keeps_the_deeper_groups():
    # All four share block 1 (4 tokens); pairs share 3 blocks (12 tokens). Two pairs save
    # 2 * 12 token reads, one group of four only 3 * 4: the pairs win.
    tables = [[1, 2, 3, 10], [1, 5, 6, 11], [1, 2, 3, 12], [1, 5, 6, 13]]
    plan = check_equal_to_plain(tables, [14, 15, 16, 13])
    assert sorted((p.block_ids.tolist(), p.num_members) for p in plan.prefixes) == [
        ([1, 2, 3], 2), ([1, 5, 6], 2)]


def test_shallow_sharing_of_many_beats_deep_sharing_of_two():
    # Eight share 2 blocks (8 tokens); two of them share 3 blocks: 7 * 8 > 1 * 12.
    tables = [[1, 2, 30 + i] for i in range(6)] + [[1, 2, 3, 40], [1, 2, 3, 41]]
    plan = check_equal_to_plain(tables, [11] * 6 + [15, 14])
    assert [(p.num_members, p.num_tokens) for p in plan.prefixes] == [(8, 8)]


def test_random_batches_match_plain_decode():
    gen = torch.Generator().manual_seed(7)
    for _ in range(20):
        heads = [[int(b) for b in torch.randperm(64, generator=gen)[:n]] for n in (1, 3, 5)]
        tables, seq_lens = [], []
        for i in range(int(torch.randint(1, 9, (1,), generator=gen))):
            head = heads[int(torch.randint(0, 3, (1,), generator=gen))]
            keep = int(torch.randint(0, len(head) + 1, (1,), generator=gen))
            own = [100 + 8 * i + j for j in range(int(torch.randint(0, 3, (1,), generator=gen)))]
            table = head[:keep] + own or [200 + i]
            lo = (len(table) - 1) * BLOCK_SIZE + 1
            seq_lens.append(int(torch.randint(lo, lo + BLOCK_SIZE, (1,), generator=gen)))
            tables.append([b % 64 for b in table])
        # distinct own blocks never collide with the shared heads' ids in a real pool;
        # here the modulo can make them collide, which only adds sharing: still exact.
        check_equal_to_plain(tables, seq_lens)


def test_merge_states_with_an_empty_side_returns_the_other():
    out = torch.randn(3, 2, 4)
    lse = torch.randn(3, 2)
    empty = torch.full((3, 2), float("-inf"))
    merged, merged_lse = cascade.merge_states(out, lse, torch.zeros_like(out), empty)
    assert torch.equal(merged, out) and torch.equal(merged_lse, lse)


def test_plan_for_another_batch_is_rejected():
    k_cache, v_cache = pool()
    bt, lens = batch([[1, 2], [1, 3]], [6, 7])
    plan = cascade.plan_cascade(bt, lens, BLOCK_SIZE)
    with pytest.raises(ValueError, match="another batch"):
        cascade.cascade_decode_attention(queries(2), k_cache, v_cache, bt, lens + 1, SCALE, plan)


def test_mixed_batch_serves_its_single_queries_through_the_plan():
    k_cache, v_cache = pool()
    # Requests 0 and 2 decode over shared blocks 4 5; request 1 is a 3-token prefill chunk.
    bt, lens = batch([[4, 5, 6], [7, 8], [4, 5, 9]], [10, 7, 12])
    q_lens = torch.tensor([1, 3, 1])
    cu = torch.tensor([0, 1, 4, 5], dtype=torch.int32)
    q = queries(5)
    plan = cascade.plan_single_query_rows(q_lens, bt, lens, BLOCK_SIZE)
    assert plan is not None and [p.num_tokens for p in plan.prefixes] == [8]
    got = ops.prefill_attention(q, k_cache, v_cache, bt, cu, lens, SCALE, 3, plan)
    want = reference.prefill_attention(q, k_cache, v_cache, bt, cu, lens, SCALE)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert cascade.plan_single_query_rows(torch.tensor([1, 3]), bt[:2], lens[:2],
                                          BLOCK_SIZE) is None
