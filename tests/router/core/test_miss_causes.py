import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kv.events import BlockRemoved, BlockStored, EventLog
from router.core.miss_causes import MissCauses, MissTokens, SeenWindow, split_causes
from router.core.prefix_match import PrefixMatch, PrefixMatches
from router.core.router import Router, RouterConfig
from tests.router.core.core_helpers import FakeClock, h
from tests.router.core.test_core import prompt, snapshot

B = 16


def make_router(**kw) -> Router:
    return Router(RouterConfig(block_size=B, **kw), clock=FakeClock())


def run(router: Router, request_id: str, hashes, n: int, delivered: int,
        replica_ids=("r0", "r1")) -> tuple[str, MissTokens]:
    """Routes, ends with `delivered` cached tokens, lets its pending marks expire;
    (replica, causes)."""
    decision = router.route(request_id, hashes, n, list(replica_ids))
    causes = router.on_finished(request_id, delivered)
    router.clock.advance(router.config.pending_ttl_s + 1)
    router.check_invariants()
    assert causes is not None and causes.total == n - delivered
    return decision.replica_id, causes


@given(n=st.integers(1, 400), c=st.integers(-5, 400), p=st.integers(-5, 400),
       o=st.integers(0, 400), s=st.integers(0, 400), d=st.integers(-5, 500))
def test_causes_add_up_to_the_uncached_tokens_for_any_input(n, c, p, o, s, d):
    causes = split_causes(n, c, p, o, s, d)
    assert min(causes) >= 0
    assert causes.total == n - min(max(d, 0), n)


def test_a_prompt_nobody_saw_is_cold_and_then_capacity_once_evicted_everywhere():
    router = make_router()
    # 4 full blocks and 5 tokens: the partial block can never be cached (cold)
    assert run(router, "q1", prompt(0, 1, 2, 3), 69, 0)[1] == MissTokens(cold=69)
    # seen now, held by no replica: the 4 blocks are capacity, the partial block cold
    assert run(router, "q2", prompt(0, 1, 2, 3), 69, 0)[1] == MissTokens(cold=5, capacity=64)
    # a longer prompt: its 5th block was never seen
    assert run(router, "q3", prompt(0, 1, 2, 3, 4), 80, 0)[1] == (
        MissTokens(cold=16, capacity=64))


def test_a_prefix_held_on_another_replica_is_placement():
    router = make_router(policy="round_robin")
    snapshot(router, "r0", device=prompt(0, 1, 2))
    replica_id, causes = run(router, "q1", prompt(0, 1, 2, 3), 64, 48)
    assert replica_id == "r0"  # round robin starts at r0: it hits what r0 holds
    assert causes == MissTokens(cold=16)  # block 3 never seen
    replica_id, causes = run(router, "q2", prompt(0, 1, 2, 3), 64, 0)
    assert replica_id == "r1"
    # r0 holds 3 blocks (placement); block 3 was seen with q1 and nobody holds it; the
    # last token is computed wherever the prompt goes
    assert causes == MissTokens(placement=48, capacity=15, cold=1)


def test_a_prefix_gone_from_the_chosen_replica_before_it_ran_is_race():
    router = make_router()
    snapshot(router, "r1", device=prompt(0, 1, 2, 3))
    replica_id, causes = run(router, "q1", prompt(0, 1, 2, 3, 4), 90, 32)
    assert replica_id == "r1"
    # predicted 64, delivered 32; block 4 never seen; 10 tokens past the last full block
    assert causes == MissTokens(race=32, cold=26)


def test_hits_beyond_the_prediction_miss_nothing():
    router = make_router()
    snapshot(router, "r1", device=prompt(0))
    # predicted 16, delivered 48: a block arrived after the decision
    assert run(router, "q1", prompt(0, 1, 2, 3), 64, 48)[1] == MissTokens(cold=16)


def test_a_fully_cached_prompt_misses_only_its_last_token_and_it_is_no_race():
    router = make_router()
    snapshot(router, "r0", device=prompt(0, 1))
    assert run(router, "q1", prompt(0, 1), 32, 31)[1] == MissTokens(cold=1)


def test_a_moved_request_counts_its_first_choice_as_placement():
    router = make_router()
    snapshot(router, "r0", device=prompt(0, 1))
    decision = router.route("q1", prompt(0, 1, 2), 48, ["r0", "r1"])
    assert decision.replica_id == "r0"
    router.move("q1", "r1")  # r0 was full
    assert router.on_finished("q1", 0) == MissTokens(placement=32, cold=16)
    assert router.misses.num_outstanding() == 0


def test_withdrawn_retried_refused_and_removed_requests_count_nothing_and_keep_nothing():
    router = make_router()
    router.route("q1", prompt(0, 1), 32, ["r0", "r1"])
    router.route("q1", prompt(0, 1), 32, ["r0", "r1"])  # a retry replaces the first
    router.route("q2", prompt(0, 1), 32, ["r0", "r1"])
    router.route("q3", prompt(5), 16, ["r0", "r1"])
    assert router.misses.num_outstanding() == 3
    router.withdraw("q2")
    assert router.on_finished("q3") is None  # no delivered count: counted nowhere
    assert router.misses.num_outstanding() == 1
    router.remove_replica(router.ledger.get("q1").replica_id)
    assert router.misses.num_outstanding() == 0
    assert router.on_finished("q1", 0) is None
    assert router.misses.totals == MissTokens()


def test_totals_add_the_ended_requests():
    router = make_router()
    run(router, "q1", prompt(0, 1), 40, 0)
    run(router, "q2", prompt(0, 1), 40, 0)
    assert router.misses.totals == MissTokens(cold=40 + 8, capacity=32)


def test_the_seen_window_is_bounded_and_remembers_at_least_half_its_capacity():
    window = SeenWindow(8)
    window.add([h(0), h(1), h(2), h(3)])
    window.add([h(4), h(5), h(6), h(7)])  # the first generation is full: a new one
    assert window.num_leading_seen([h(0), h(1), h(2), h(3)]) == 4  # still remembered
    window.add([h(8), h(9), h(10), h(11)])  # drops h(0..3)
    assert len(window) <= 8 + 4
    assert window.num_leading_seen([h(0)]) == 0
    assert window.num_leading_seen([h(4), h(5), h(8), h(0)]) == 3
    with pytest.raises(ValueError, match="capacity_blocks must be >= 2"):
        SeenWindow(1)


def test_the_window_reads_seen_blocks_across_its_two_generations():
    causes = MissCauses(B, 4)
    causes.seen.add([h(0), h(1)])
    causes.seen.add([h(2)])  # a new generation: h(0), h(1) in the previous one
    assert causes.seen.num_leading_seen([h(0), h(1), h(2), h(3)]) == 3


def test_seen_window_blocks_is_validated():
    with pytest.raises(ValueError, match="seen_window_blocks must be an integer >= 2"):
        RouterConfig(seen_window_blocks=1)


def test_blocks_a_replica_stored_are_seen_whoever_routed_them():
    # another router's request had blocks 0-2 computed on r0; then r0 evicted them
    router = make_router()
    log = EventLog("r0", epoch="e0")
    assert router.apply_batch(log.drain())
    router.apply_snapshot(log.snapshot((), ()))
    log.append(BlockStored(tuple(prompt(0, 1, 2)), None, "device"))
    log.append(BlockRemoved(tuple(prompt(0, 1, 2)), "device"))
    assert not router.apply_batch(log.drain())
    assert run(router, "q1", prompt(0, 1, 2, 3), 64, 0)[1] == MissTokens(capacity=48, cold=16)


def test_a_run_longer_than_half_the_window_keeps_its_last_half_and_the_bound():
    window = SeenWindow(8)
    window.add([h(i) for i in range(10)])
    assert window.num_leading_seen([h(i) for i in range(6, 10)]) == 4
    assert window.num_leading_seen([h(5)]) == 0
    window.add([h(20), h(21), h(22)])  # the generation is full: a new one
    assert len(window) == 7 and window.num_leading_seen([h(i) for i in range(6, 10)]) == 4
    window.add([h(30), h(31)])  # h(30) fills it; h(31) starts a third: h(6..9) dropped
    assert window.num_leading_seen([h(6)]) == 0 and len(window) <= 8


@given(capacity=st.integers(2, 12),
       runs=st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 24), max_size=14)),
                     max_size=12))
def test_stored_runs_added_later_leave_the_window_as_added_at_once(capacity, runs):
    now, later = SeenWindow(capacity), SeenWindow(capacity)
    for stored, run in runs:  # stored: a replica's event (deferred), else a request's end
        now.add([h(i) for i in run])
        (later.add_later if stored else later.add)([h(i) for i in run])
    every = [h(i) for i in range(25)]
    assert [later.num_leading_seen([x]) for x in every] == [
        now.num_leading_seen([x]) for x in every]
    assert len(later) == len(now)
    assert (later._current, later._previous) == (now._current, now._previous)


@pytest.mark.parametrize("as_arrays", [True, False])
def test_placement_is_the_longest_prefix_of_the_other_candidates(as_arrays):
    """The replica the request ran on is no placement, even where it held the longest
    prefix (its prediction went stale: 1 block of its 4): the other's 2 blocks are. A walk's
    arrays and a plain mapping say the same."""
    matches = {"a": PrefixMatch(3, 1), "b": PrefixMatch(2, 0), "c": PrefixMatch(0, 1)}
    if as_arrays:
        ids = list(matches)
        matches = PrefixMatches(ids, np.array([matches[r].num_device_blocks for r in ids]),
                                np.array([matches[r].num_cached_blocks for r in ids]))
    causes = MissCauses(B, 64)
    causes.on_route("q1", prompt(0, 1, 2, 3, 4), 80, matches)
    assert causes.on_end("q1", "a", predicted_tokens=B, delivered_tokens=B) == (
        MissTokens(cold=80 - 2 * B, placement=B))
    causes.on_route("q2", prompt(0, 1, 2, 3, 4), 80, PrefixMatches([], np.zeros(0, int),
                                                                   np.zeros(0, int)))
    assert causes.on_end("q2", "a", predicted_tokens=0, delivered_tokens=0) == (
        MissTokens(cold=1, capacity=5 * B - 1))  # seen with q1, held by none
