from collections import Counter

import pytest

from kv.events import BlockRemoved, EventLog
from protocol.engine import EngineStats
from router.core.policies import POLICY_NAMES
from router.core.router import Router, RouterConfig, RoutingDecision
from tests.router.core.core_helpers import FakeClock, h

B = 16  # block size
REPLICAS = ["r0", "r1", "r2", "r3"]


def prompt(*block_ids: int) -> list[bytes]:
    return [h(i) for i in block_ids]


def make_router(**kw) -> tuple[Router, FakeClock]:
    clock = FakeClock()
    return Router(RouterConfig(block_size=B, **kw), clock=clock), clock


def route(router: Router, request_id: str, hashes, replica_ids=REPLICAS, max_tokens=0,
          num_prompt_tokens=None) -> RoutingDecision:
    n = len(hashes) * B if num_prompt_tokens is None else num_prompt_tokens
    decision = router.route(request_id, hashes, n, replica_ids, max_tokens)
    router.check_invariants()
    # the ranking (tested in test_ranking.py) holds every candidate once, the choice first
    assert decision.ranked_ids[0] == decision.replica_id
    assert sorted(decision.ranked_ids) == sorted(dict.fromkeys(replica_ids))
    return decision._replace(ranked_ids=())


def snapshot(router: Router, replica_id: str, device=(), host=()) -> None:
    log = EventLog(replica_id, epoch="e0")
    assert router.apply_batch(log.drain())  # no events seen yet: needs a snapshot
    router.apply_snapshot(log.snapshot(device, host))
    router.check_invariants()


@pytest.mark.parametrize("kw, message", [
    ({"policy": "best"}, "unknown policy 'best'"),
    ({"block_size": 0}, "block_size must be a positive integer"),
    ({"load_weight": -1.0}, "load_weight must be finite and >= 0"),
    ({"host_cost_fraction": 1.5}, r"host_cost_fraction must be in \[0, 1\]"),
    ({"imbalance_threshold": 0.0}, "imbalance_threshold must be > 0"),
    ({"pending_ttl_s": 0.0}, "pending_ttl_s must be finite and > 0"),
    ({"approx_capacity_blocks": 0}, "approx_capacity_blocks must be a positive integer"),
    ({"approx_ttl_s": float("inf")}, "approx_ttl_s must be finite"),
    ({"hash_prefix_blocks": 0}, "hash_prefix_blocks must be a positive integer"),
    ({"fallback_warmup_blocks": 0}, "fallback_warmup_blocks must be a positive integer"),
])
def test_config_is_validated_with_clear_messages(kw, message):
    with pytest.raises(ValueError, match=message):
        RouterConfig(**kw)


def test_routes_to_the_replica_holding_the_prefix_and_predicts_its_hits():
    router, _ = make_router()
    snapshot(router, "r1", device=prompt(0, 1), host=prompt(2))
    snapshot(router, "r2", device=prompt(0, 1, 2, 3))
    assert route(router, "q1", prompt(0, 1, 2, 3, 4)) == RoutingDecision("r2", 64, 0, False)
    assert route(router, "q2", prompt(0, 1, 2, 7), replica_ids=["r0", "r1"]) == (
        RoutingDecision("r1", 32, 16, False))
    assert router.index_blocks() == {"device": 4, "host": 1}


def test_burst_of_same_prefix_requests_lands_on_one_replica_before_any_event():
    router, clock = make_router(pending_ttl_s=2.0)
    burst = prompt(*range(32))  # 512 tokens
    decisions = [route(router, f"q{i}", burst, max_tokens=16) for i in range(8)]
    assert [d.replica_id for d in decisions] == ["r0"] * 8
    assert [d.predicted_device_hit_tokens for d in decisions] == [0] + [512] * 7
    assert router.index.match(burst, REPLICAS) == {"r0": (32, 0)}
    clock.advance(60.0)  # queued for a minute, no event yet: the marks are held
    assert router.index.match(burst, REPLICAS) == {"r0": (32, 0)}
    for i in range(7):
        router.on_finished(f"q{i}")
    clock.advance(60.0)  # one request still holds them
    assert router.index.match(burst, REPLICAS) == {"r0": (32, 0)}
    router.on_finished("q7")
    clock.advance(1.9)  # its events may still be on their way
    assert router.index.match(burst, REPLICAS) == {"r0": (32, 0)}
    clock.advance(0.1)  # no event came within the TTL: the marks expire
    assert router.index.match(burst, REPLICAS) == {}
    router.check_invariants()
    assert route(router, "q8", burst, max_tokens=16) == RoutingDecision("r1", 0, 0, False)


def test_a_held_mark_confirmed_by_an_event_ends_with_the_event():
    router, clock = make_router(pending_ttl_s=2.0)
    route(router, "q0", prompt(0, 1, 2))
    snapshot(router, "r0", device=prompt(0, 1))  # block 2 not computed yet
    assert len(router.index.pending) == 1
    router.on_finished("q0")  # e.g. aborted before its last block was computed
    clock.advance(2.0)
    assert router.index.match(prompt(0, 1, 2), REPLICAS) == {"r0": (2, 0)}
    assert len(router.index.pending) == 0
    router.check_invariants()


def test_a_removed_replica_takes_its_held_marks_along():
    router, clock = make_router()
    route(router, "q0", prompt(0, 1))
    router.remove_replica("r0")
    router.on_finished("q0")  # a no-op: the replica (and its slot's marks) are gone
    assert router.index.match(prompt(0, 1), REPLICAS) == {}
    assert len(router.index.pending) == 0
    router.check_invariants()


def test_events_confirm_pending_marks():
    router, clock = make_router()
    route(router, "q0", prompt(0, 1, 2))
    assert len(router.index.pending) == 3
    snapshot(router, "r0", device=prompt(0, 1))
    assert len(router.index.pending) == 1  # block 2 is still being computed
    router.on_finished("q0")
    clock.advance(5.0)
    assert router.index.match(prompt(0, 1, 2), REPLICAS) == {"r0": (2, 0)}


def test_without_whole_prompt_marks_only_unconfirmed_blocks_are_marked():
    router, clock = make_router(pending_ttl_s=2.0, mark_whole_prompt=False)
    snapshot(router, "r2", device=prompt(0, 1, 2, 3))
    assert route(router, "q0", prompt(0, 1, 2, 3, 4, 5)).replica_id == "r2"
    assert router.index.pending_blocks("r2") == set(prompt(4, 5))
    clock.advance(1.5)
    assert route(router, "q1", prompt(0, 1, 2, 3, 4, 5)) == RoutingDecision("r2", 96, 0, False)
    router.on_finished("q0")
    clock.advance(2.5)  # q0 is done and its TTL has run out; q1 still holds the marks
    assert router.index.match(prompt(0, 1, 2, 3, 4, 5), REPLICAS) == {"r2": (6, 0)}
    router.on_finished("q1")
    clock.advance(2.0)
    assert router.index.match(prompt(0, 1, 2, 3, 4, 5), REPLICAS) == {"r2": (4, 0)}


def routed_to_a_cached_run(**kw):
    """r2 holds blocks 0-3 (events); q0 (blocks 0-5) is routed there."""
    router, clock = make_router(pending_ttl_s=2.0, **kw)
    log = EventLog("r2", epoch="e0")
    assert router.apply_batch(log.drain())
    router.apply_snapshot(log.snapshot(prompt(0, 1, 2, 3), ()))
    assert route(router, "q0", prompt(0, 1, 2, 3, 4, 5)).replica_id == "r2"
    # marks cover what q0 computes; its cached run is pinned, not marked
    assert router.index.pending_blocks("r2") == set(prompt(4, 5))
    return router, clock, log


def evict(router, log, *block_ids):
    log.append(BlockRemoved(tuple(prompt(*block_ids))))
    assert not router.apply_batch(log.drain())
    router.check_invariants()


def test_an_eviction_while_a_request_waits_does_not_hide_its_prompt():
    # the default pins the run: r2 will hold all of q0's prompt when q0 runs
    router, clock, log = routed_to_a_cached_run()
    evict(router, log, 3)
    assert router.index.pending_blocks("r2") == set(prompt(3, 4, 5))
    evict(router, log, 1, 2)  # deeper, in a later batch
    assert router.index.pending_blocks("r2") == set(prompt(1, 2, 3, 4, 5))
    assert router.index.match(prompt(0, 1, 2, 3, 4, 5), REPLICAS) == {"r2": (6, 0)}
    router.on_finished("q0")
    clock.advance(2.5)  # no event came: its marks end with the TTL
    assert router.index.match(prompt(0, 1, 2, 3, 4, 5), REPLICAS) == {"r2": (1, 0)}
    router.check_invariants()
    plain, _, plain_log = routed_to_a_cached_run(mark_whole_prompt=False)
    evict(plain, plain_log, 2, 3)
    assert plain.index.match(prompt(0, 1, 2, 3, 4, 5), REPLICAS) == {"r2": (2, 0)}


def test_a_snapshot_missing_the_run_pins_it_and_a_finished_request_pins_nothing():
    router, _, log = routed_to_a_cached_run()
    router.apply_snapshot(log.snapshot(prompt(0, 1), ()))  # a resync: 2 and 3 are gone
    router.check_invariants()
    assert router.index.pending_blocks("r2") == set(prompt(2, 3, 4, 5))
    router, _, log = routed_to_a_cached_run()
    router.on_finished("q0")
    evict(router, log, 0, 1, 2, 3)  # after q0: nothing of it is held any more
    assert router.index.pending_blocks("r2") == set(prompt(4, 5))  # its TTL marks only
    assert len(router.pins) == 0


def test_shared_first_block_spreads_under_cache_aware_and_piles_up_under_longest_match():
    replicas = [f"r{i}" for i in range(8)]
    requests = [prompt(0, *range(1000 * i + 1, 1000 * i + 32)) for i in range(1, 65)]
    counts = {}
    for name in ("cache_aware", "longest_prefix"):
        router, _ = make_router(policy=name)
        chosen = [route(router, f"q{i}", p, replicas, max_tokens=64).replica_id
                  for i, p in enumerate(requests)]
        counts[name] = Counter(chosen)
    assert counts["cache_aware"] == {r: 8 for r in replicas}
    assert counts["longest_prefix"] == {"r0": 64}


def test_unknown_replicas_are_routable_and_only_candidates_are_chosen():
    for name in POLICY_NAMES:
        router, _ = make_router(policy=name)
        snapshot(router, "r9", device=prompt(0, 1, 2))  # best cache, but not a candidate
        for i in range(6):
            d = route(router, f"q{i}", prompt(0, 1, 2), replica_ids=["new-a", "new-b"])
            assert d.replica_id in ("new-a", "new-b"), name
        assert route(router, "dup", prompt(5), replica_ids=["r1", "r1"]).replica_id == "r1"


def test_route_rejects_no_candidates_and_hashes_longer_than_the_prompt():
    router, _ = make_router()
    with pytest.raises(ValueError, match="no replica to choose from"):
        router.route("q", prompt(0), 16, [])
    with pytest.raises(ValueError, match="2 block hashes for 31 prompt tokens"):
        router.route("q", prompt(0, 1), 31, REPLICAS)


def test_approximate_mode_predicts_from_routed_history_with_lru_and_ttl():
    router, clock = make_router(approximate=True, approx_capacity_blocks=8, approx_ttl_s=10.0)
    a, b = prompt(0, 1, 2, 3), prompt(10, 11, 12, 13, 14, 15)
    assert route(router, "q1", a) == RoutingDecision("r0", 0, 0, True)
    router.on_finished("q1")
    assert route(router, "q2", a) == RoutingDecision("r0", 64, 0, True)
    router.on_finished("q2")
    assert len(router.index.pending) == 0  # approximate: events index untouched
    # 10 blocks on r0 > 8: the two least recent go, and a prompt's tail goes first
    route(router, "q3", b, replica_ids=["r0"])
    router.on_finished("q3")
    assert route(router, "q4", a, replica_ids=["r0"]) == RoutingDecision("r0", 32, 0, True)
    router.on_finished("q4")
    assert router.index_blocks() == {"device": 8, "host": 0}
    clock.advance(10.0)
    # Nothing remembered: a tie at cost 128, load 0; it goes to the replica with the least
    # work routed so far (r0 had q1..q4).
    assert route(router, "q5", a) == RoutingDecision("r1", 0, 0, True)


def test_fallback_switches_to_history_and_back_to_events():
    router, _ = make_router()
    p, q = prompt(0, 1, 2), prompt(7, 8)
    snapshot(router, "r1", device=p)
    snapshot(router, "r2", device=q)
    assert route(router, "q1", p) == RoutingDecision("r1", 48, 0, False)
    router.on_finished("q1")
    router.set_fallback(True)
    assert route(router, "q2", p) == RoutingDecision("r1", 48, 0, True)  # history knows
    router.on_finished("q2")
    assert route(router, "q3", q) == RoutingDecision("r0", 0, 0, True)  # history does not
    router.on_finished("q3")
    router.set_fallback(False)
    assert route(router, "q4", q) == RoutingDecision("r2", 32, 0, False)


def test_fallback_decides_from_last_events_until_every_replica_is_replayed():
    router, _ = make_router(fallback_warmup_blocks=1)  # one routed prompt per decision
    p, q, z, y = prompt(0, 1, 2), prompt(7, 8), prompt(50, 51), prompt(60, 61)
    snapshot(router, "r1", device=p)
    snapshot(router, "r2", device=q)
    snapshot(router, "r3", device=z + y)
    for request_id, hashes in (("a", p), ("b", q)):
        route(router, request_id, hashes)
        router.on_finished(request_id)
    router.set_fallback(True)  # r1 and r2 have history to replay
    assert route(router, "c", z) == RoutingDecision("r3", 32, 0, True)  # events, stale
    router.on_finished("c")
    assert router.history.warming
    assert route(router, "d", y) == RoutingDecision("r0", 0, 0, True)  # history only now
    router.on_finished("d")
    assert not router.history.warming
    assert route(router, "e", q) == RoutingDecision("r2", 32, 0, True)


def test_outstanding_work_and_published_stats_steer_least_load():
    # outstanding work only: no recent-work memory (test_load_model.py has it)
    router, _ = make_router(policy="least_load", recent_work_half_life_s=0.0)
    chosen = [route(router, f"q{i}", prompt(i), max_tokens=10).replica_id for i in range(4)]
    assert chosen == REPLICAS
    assert router.loads.load("r0") == 16 + 10
    router.on_finished("q2")
    router.on_finished("q2")  # twice: no effect
    assert route(router, "q4", prompt(4)).replica_id == "r2"
    stats = EngineStats(num_running=0, num_waiting=3, num_queued_prefill_tokens=5000,
                        num_blocks=100, num_used_blocks=0, num_cached_blocks=0,
                        num_pinned_blocks=0, num_free_blocks=100, num_host_blocks=0,
                        num_host_cached_blocks=0)
    router.update_stats("r3", stats)
    assert router.loads.load("r3") > 5000
    for r in ("q0", "q1", "q3", "q4"):
        router.on_finished(r)
    fresh = [route(router, f"z{i}", prompt(100 + i)).replica_id for i in range(3)]
    assert fresh == ["r0", "r1", "r2"]  # r3 is busy with other routers' work


def test_remove_replica_forgets_its_index_history_and_load():
    router, _ = make_router()
    snapshot(router, "r1", device=prompt(0, 1), host=prompt(2))
    assert route(router, "q1", prompt(0, 1, 2, 3)).replica_id == "r1"
    router.remove_replica("r1")
    router.check_invariants()
    assert "r1" not in router.index and "r1" not in router.history.replica_ids
    assert router.loads.num_outstanding("r1") == 0
    assert router.index_blocks() == {"device": 0, "host": 0}
    router.on_finished("q1")  # its request is gone with it: a no-op
    assert route(router, "q2", prompt(0, 1, 2, 3)) == RoutingDecision("r0", 0, 0, False)
