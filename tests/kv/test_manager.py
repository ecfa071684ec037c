import pytest

from kv.events import BlockRemoved, BlockStored
from kv.hashing import namespace_root
from kv.manager import KVCacheConfig, MatchResult
from tests.kv.conftest import ROOT, admit, hashes, make_manager

A = list(range(100, 112))  # 3 full blocks of 4
B = A[:8] + [900, 901, 902, 903, 904]  # shares 2 blocks with A, then 1 full + 1 partial


def test_allocate_reuses_cached_prefix_and_takes_new_blocks():
    mgr = make_manager(8)
    ids, m = admit(mgr, "a", A)
    assert ids == [0, 1, 2] and m == MatchResult(0, 0, 0)
    mgr.cache_blocks("a", hashes(A), 12)
    ids, m = admit(mgr, "b", B)
    assert m == MatchResult(2, 0, 0)
    assert ids == [0, 1, 3, 4]
    assert [mgr.pool.blocks[i].ref_cnt for i in range(5)] == [2, 2, 1, 1, 1]
    mgr.check_invariants()


def test_free_is_tail_first_so_prompt_tails_are_evicted_before_shared_heads():
    mgr = make_manager(6)
    admit(mgr, "a", A)
    mgr.cache_blocks("a", hashes(A), 12)
    mgr.free("a")
    assert mgr.pool.free_queue.block_ids() == [3, 4, 5, 2, 1, 0]
    # 4 new blocks: the 3 never-used ones, then A's last block (its tail) is evicted first.
    admit(mgr, "c", list(range(500, 516)))
    assert mgr.match(hashes(A)) == MatchResult(2, 0, 0)
    assert mgr.usage() == {"used": 4, "cached": 2, "pinned": 0, "free": 0}
    mgr.check_invariants()


def test_revive_on_hit_after_free():
    mgr = make_manager(4)
    admit(mgr, "a", A)
    mgr.cache_blocks("a", hashes(A), 12)
    mgr.free("a")
    ids, m = admit(mgr, "a2", A + [1])
    assert m.num_device_blocks == 3 and ids == [0, 1, 2, 3]
    assert mgr.pool.num_evictions == 0
    mgr.check_invariants()


def test_can_allocate_counts_only_needed_blocks_and_evictable_cached_as_free():
    mgr = make_manager(4)
    admit(mgr, "a", A)
    mgr.cache_blocks("a", hashes(A), 12)
    mgr.free("a")  # 3 cached-free + 1 free
    h = hashes(A + [1, 2, 3, 4])
    m = mgr.match(h)
    assert m.num_device_blocks == 3
    # 4 blocks in all, 3 cached: needs 1 new. Reviving 3 leaves 1 free: fits exactly.
    assert mgr.num_new_blocks_needed("x", 16, m) == 1
    assert mgr.can_allocate("x", 16, h, m)
    assert not mgr.can_allocate("x", 17, h, m)
    # A cold request can use the evictable cached blocks as free.
    assert mgr.can_allocate("y", 16)
    assert mgr.allocate("y", 17) is None
    mgr.check_invariants()


def test_decode_fills_blocks_that_get_hashes_for_multi_turn_reuse():
    mgr = make_manager(8)
    prompt = [1, 2, 3, 4, 5, 6]
    admit(mgr, "a", prompt)
    mgr.cache_blocks("a", hashes(prompt), 6)
    assert len(mgr.pool.cached) == 1
    tokens = prompt + [7, 8]  # two generated tokens fill block 1
    mgr.allocate("a", 9)  # room for the next token
    mgr.cache_blocks("a", hashes(tokens), 8)
    assert len(mgr.pool.cached) == 2
    mgr.free("a")
    # Turn two resends the history: both blocks hit.
    assert mgr.match(hashes(tokens + [9, 10, 11, 12])).num_device_blocks == 2
    mgr.check_invariants()


def test_adapter_and_salt_namespaces_never_share_blocks():
    mgr = make_manager(16)
    roots = [ROOT, namespace_root("m", salt="t1"), namespace_root("m", adapter="lora")]
    for i, root in enumerate(roots):
        ids, m = admit(mgr, f"r{i}", A, root=root)
        assert m.num_device_blocks == 0
        assert ids == [3 * i, 3 * i + 1, 3 * i + 2]
        mgr.cache_blocks(f"r{i}", hashes(A, root), 12)
    assert len(mgr.pool.cached) == 9
    assert admit(mgr, "again", A, root=roots[1])[1].num_device_blocks == 3
    mgr.check_invariants()


def test_pin_budget_and_pinned_blocks_are_never_evicted():
    mgr = make_manager(4, pin_budget_blocks=2)
    admit(mgr, "a", A)
    mgr.cache_blocks("a", hashes(A), 12)
    mgr.free("a")
    assert mgr.pin("too-big", hashes(A)) is None  # 3 blocks > budget 2
    assert mgr.pin("sys", hashes(A)[:2]) == 2
    assert mgr.pin("sys-again", hashes(A)[:1]) == 1  # shares a pinned block: no new budget
    assert mgr.pin("missing", hashes(list(range(4)))) is None  # not cached
    # Every unpinned block can be taken; the pinned ones survive.
    assert admit(mgr, "big", list(range(300, 308)))[0] is not None
    assert mgr.match(hashes(A)).num_device_blocks == 2
    assert mgr.usage() == {"used": 2, "cached": 0, "pinned": 2, "free": 0}
    mgr.free("big")
    assert mgr.unpin("sys") and mgr.unpin("sys-again") and not mgr.unpin("sys")
    assert mgr.num_pinned_blocks == 0
    mgr.check_invariants()


def test_in_flight_prefix_is_reported_pending_until_computed():
    mgr = make_manager(8)
    admit(mgr, "a", A)
    assert mgr.match(hashes(B)) == MatchResult(0, 0, 2)
    mgr.cache_blocks("a", hashes(A), 8)  # first two blocks computed
    assert mgr.match(hashes(B)) == MatchResult(2, 0, 0)
    mgr.free("a")
    assert mgr.match(hashes(A)) == MatchResult(2, 0, 0)
    mgr.check_invariants()


def test_host_tier_takes_evicted_blocks_and_hands_them_back():
    mgr = make_manager(3, num_host_blocks=4)
    admit(mgr, "a", A)
    mgr.cache_blocks("a", hashes(A), 12)
    mgr.free("a")
    mgr.event_log.drain()
    admit(mgr, "b", list(range(700, 712)))  # evicts all three of A's blocks to host
    plan = mgr.take_copy_plan()
    assert plan.swap_out == [(2, 0), (1, 1), (0, 2)]  # tail first
    events = mgr.event_log.drain().events
    assert BlockRemoved(tuple(hashes(A)[::-1]), "device") in events
    assert sum(isinstance(e, BlockStored) and e.medium == "host" for e in events) == 3
    mgr.free("b")
    ids, m = admit(mgr, "a2", A)
    assert m == MatchResult(0, 3, 0)
    plan = mgr.take_copy_plan()
    assert plan.swap_in == [(2, ids[0]), (1, ids[1]), (0, ids[2])]
    assert mgr.match(hashes(A)).num_device_blocks == 3  # findable on device again
    mgr.check_invariants()


def test_prefix_caching_off_never_matches():
    mgr = make_manager(8, enable_prefix_caching=False)
    admit(mgr, "a", A)
    mgr.cache_blocks("a", hashes(A), 12)
    mgr.free("a")
    assert mgr.match(hashes(A)) == MatchResult(0, 0, 0)


@pytest.mark.parametrize("kw, msg", [
    (dict(num_blocks=0), "num_blocks"),
    (dict(num_blocks=4, block_size=0), "block_size"),
    (dict(num_blocks=4, num_host_blocks=-1), "num_host_blocks"),
    (dict(num_blocks=4, pin_budget_blocks=5), "pin_budget_blocks"),
])
def test_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        KVCacheConfig(**kw)


def test_block_table_is_cached_and_a_handed_out_table_never_changes():
    mgr = make_manager(8)
    first, _ = admit(mgr, "a", [1, 2, 3, 4, 5])
    assert first == [0, 1]
    assert mgr.allocate("a", 8) is first  # no new block: the same list, nothing rebuilt
    grown = mgr.allocate("a", 9)
    assert grown == [0, 1, 2] and first == [0, 1]  # a step built earlier keeps its table
    assert mgr.block_ids("a") is grown
    assert mgr.allocate("a", 100) is None and mgr.block_ids("a") == [0, 1, 2]
    mgr.cache_blocks("a", hashes([1, 2, 3, 4, 5, 6, 7, 8]), 8)
    mgr.free("a")
    ids, m = admit(mgr, "b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert m.num_device_blocks == 2 and ids == [0, 1, 3]
    assert mgr.allocate("b", 13) == [0, 1, 3, 4]
    mgr.check_invariants()


def test_failed_step_forgets_the_cache_entries_its_copies_were_to_fill():
    mgr = make_manager(3, num_host_blocks=4)
    admit(mgr, "a", A)
    mgr.cache_blocks("a", hashes(A), 12)
    mgr.free("a")
    admit(mgr, "b", list(range(700, 712)))  # evicts A's blocks to host: swap_out planned
    mgr.abort_copy_plan(mgr.take_copy_plan())  # the step failed before copying
    assert not any(h in mgr.host for h in hashes(A))
    assert mgr.match(hashes(A)) == MatchResult(0, 0, 0)
    mgr.free("b")
    mgr.check_invariants()

    mgr = make_manager(3, num_host_blocks=4)
    admit(mgr, "a", A)
    mgr.cache_blocks("a", hashes(A), 12)
    mgr.free("a")
    admit(mgr, "b", list(range(700, 712)))
    mgr.take_copy_plan()  # these copies ran
    mgr.free("b")
    mgr.event_log.drain()
    admit(mgr, "a2", A)  # host hits: swap_in planned, device blocks cached at once
    mgr.abort_copy_plan(mgr.take_copy_plan())
    mgr.free("a2")
    assert mgr.match(hashes(A)).num_device_blocks == 0  # no garbage device hit
    assert mgr.match(hashes(A)).num_host_blocks == 3  # the host copies are still good
    assert BlockRemoved(tuple(hashes(A)), "device") in mgr.event_log.drain().events
    mgr.check_invariants()



def test_repin_credits_the_blocks_it_frees():
    mgr = make_manager(8, pin_budget_blocks=3)
    other = list(range(300, 312))
    admit(mgr, "a", A)
    mgr.cache_blocks("a", hashes(A), 12)
    admit(mgr, "o", other)
    mgr.cache_blocks("o", hashes(other), 12)
    mgr.free("a")
    mgr.free("o")
    assert mgr.pin("sys", hashes(A)) == 3
    # Moving "sys" to another 3-block prefix frees A's 3 blocks: within the budget.
    assert mgr.pin("sys", hashes(other)) == 3
    assert mgr.num_pinned_blocks == 3
    # A block another name still holds is not freed by the re-pin.
    assert mgr.pin("keep", hashes(other)[:1]) == 1
    assert mgr.pin("sys", hashes(A)) is None  # frees 2, needs 3 new: 1 + 3 > 3
    mgr.check_invariants()
