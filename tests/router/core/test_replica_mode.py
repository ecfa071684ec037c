"""Per-replica mode: replicas without (fresh) events are routed on history, the others on
events, in the same decision."""

from router.core.router import Router, RouterConfig, RoutingDecision
from tests.router.core.core_helpers import FakeClock, h

B = 16
REPLICAS = ["r0", "r1", "r2"]


def prompt(*block_ids: int) -> list[bytes]:
    return [h(i) for i in block_ids]


def make_router(**kw) -> Router:
    return Router(RouterConfig(block_size=B, **kw), clock=FakeClock())


def route(router: Router, request_id: str, hashes, replica_ids=REPLICAS) -> RoutingDecision:
    decision = router.route(request_id, hashes, len(hashes) * B, replica_ids)
    router.check_invariants()
    router.on_finished(request_id)
    router.check_invariants()
    # the ranking (tested in test_ranking.py) holds every candidate once, the choice first
    assert decision.ranked_ids[0] == decision.replica_id
    assert sorted(decision.ranked_ids) == sorted(dict.fromkeys(replica_ids))
    return decision._replace(ranked_ids=())


def snapshot(router: Router, replica_id: str, device=()) -> None:
    from kv.events import EventLog

    log = EventLog(replica_id, epoch="e0")
    assert router.apply_batch(log.drain())
    router.apply_snapshot(log.snapshot(device, ()))


def test_a_replica_without_events_is_routed_on_history_beside_replicas_with_events():
    router = make_router()
    p, q = prompt(0, 1, 2), prompt(7, 8)
    snapshot(router, "r0", device=q)
    router.set_replica_approximate("r2", True)
    assert router.history.active and not router.history.warming  # nothing to replay
    # Nobody holds p: a tie at load 0 goes to the replica with the least work routed so far.
    assert route(router, "a", p, ["r2", "r1"]) == RoutingDecision("r2", 0, 0, True)
    # r2's history now holds p; r0's events hold q; r1 has neither.
    assert route(router, "b", p) == RoutingDecision("r2", 48, 0, True)
    assert route(router, "c", q) == RoutingDecision("r0", 32, 0, False)
    # Only replicas routed on events get pending marks.
    assert router.index.pending_blocks("r2") == frozenset()
    assert router.index.pending_blocks("r0") == frozenset()  # q confirmed: nothing to mark
    route(router, "d", prompt(20, 21), ["r1"])
    assert router.index.pending_blocks("r1") == frozenset(prompt(20, 21))


def test_events_of_an_approximate_replica_are_ignored_until_it_is_back_on_events():
    router = make_router()
    p = prompt(0, 1, 2)
    snapshot(router, "r1", device=p)
    router.set_replica_approximate("r1", True)  # its events went stale
    assert router.is_approximate("r1") and not router.is_approximate("r0")
    # History knows nothing about r1 yet: the stale events no longer decide for it.
    assert route(router, "a", p, ["r0", "r1"]) == RoutingDecision("r0", 0, 0, False)
    router.set_replica_approximate("r1", False)
    assert not router.history.active  # no replica left on history: the LRU is dropped
    assert route(router, "b", p) == RoutingDecision("r1", 48, 0, False)


def test_a_replica_turning_approximate_decides_on_last_events_until_history_is_replayed():
    router = make_router(fallback_warmup_blocks=1)
    p, q, z = prompt(0, 1, 2), prompt(7, 8), prompt(40, 41)
    snapshot(router, "r1", device=z)
    for request_id, hashes, target in (("a", p, "r0"), ("b", q, "r2")):
        assert route(router, request_id, hashes, [target]).replica_id == target
    router.set_replica_approximate("r1", True)  # r0 and r2 have history to replay
    assert route(router, "c", z) == RoutingDecision("r1", 32, 0, True)  # stale events
    assert router.history.warming
    # The history warms up in decisions that have an approximate candidate.
    route(router, "d", prompt(50), ["r0"])
    assert router.history.warming
    assert route(router, "e", prompt(51), ["r0", "r1"]) == RoutingDecision("r1", 0, 0, True)
    assert not router.history.warming
    # Replayed: r1's history holds z (routed there by "c"); r0 and r2 stay on events.
    assert route(router, "f", z) == RoutingDecision("r1", 32, 0, True)
    assert route(router, "g", q) == RoutingDecision("r2", 32, 0, False)  # b's pending mark


def test_policies_without_the_index_report_the_hits_of_the_chosen_replicas_mode():
    router = make_router(policy="round_robin")
    p = prompt(0, 1)
    snapshot(router, "r0", device=p)
    router.set_replica_approximate("r1", True)
    assert route(router, "a", p) == RoutingDecision("r0", 32, 0, False)
    assert route(router, "b", p) == RoutingDecision("r1", 0, 0, True)
    assert route(router, "c", p) == RoutingDecision("r2", 0, 0, False)
    assert route(router, "d", p) == RoutingDecision("r0", 32, 0, False)
    assert route(router, "e", p) == RoutingDecision("r1", 32, 0, True)  # its history has p


def test_removing_the_last_approximate_replica_deactivates_the_history():
    router = make_router()
    router.set_replica_approximate("r2", True)
    route(router, "a", prompt(0), ["r2"])
    router.remove_replica("r2")
    router.check_invariants()
    assert not router.is_approximate("r2")
    assert not router.history.active
    router.set_fallback(True)
    assert router.is_approximate("r0") and router.history.active
