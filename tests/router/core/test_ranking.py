"""The router ranks every candidate, best first (Ray Serve tries them in turn), drops a
retried request's own record before ranking it again, and moves a request that landed
further down the ranking."""

from kv.events import EventLog
from router.core.router import Router, RouterConfig, RoutingDecision
from tests.router.core.core_helpers import FakeClock, h

B = 16
REPLICAS = ["r0", "r1", "r2", "r3"]


def prompt(*block_ids: int) -> list[bytes]:
    return [h(i) for i in block_ids]


def make_router(**kw) -> Router:
    return Router(RouterConfig(block_size=B, **kw), clock=FakeClock())


def snapshot(router: Router, replica_id: str, device=()) -> None:
    log = EventLog(replica_id, epoch="e0")
    assert router.apply_batch(log.drain())
    router.apply_snapshot(log.snapshot(device, ()))


def route(router: Router, request_id: str, hashes, max_tokens=0) -> RoutingDecision:
    decision = router.route(request_id, hashes, len(hashes) * B, REPLICAS, max_tokens)
    router.check_invariants()
    return decision


def test_cache_aware_ranks_by_cost_then_load_then_listed_order():
    router = make_router(load_weight=1.0)
    snapshot(router, "r1", device=prompt(0, 1, 2, 3))
    snapshot(router, "r2", device=prompt(0, 1))
    # cost = uncached tokens: r1 16, r2 48, r0 and r3 80 (tied: listed order)
    assert route(router, "q1", prompt(0, 1, 2, 3, 4), max_tokens=100) == RoutingDecision(
        "r1", 64, 0, False, ("r1", "r2", "r0", "r3"))
    # a new prefix costs 32 everywhere; r1 carries q1's 116 tokens of work: last
    assert route(router, "q2", prompt(50, 51)).ranked_ids == ("r0", "r2", "r3", "r1")


def test_every_policy_ranks_every_candidate_once():
    expected = {
        "round_robin": [("r0", "r1", "r2", "r3"), ("r1", "r2", "r3", "r0")],
        "least_load": [("r0", "r1", "r2", "r3"), ("r1", "r2", "r3", "r0")],
        "longest_prefix": [("r1", "r0", "r2", "r3"), ("r1", "r0", "r2", "r3")],
    }
    for policy, rankings in expected.items():
        router = make_router(policy=policy)
        snapshot(router, "r1", device=prompt(0, 1))
        got = [route(router, f"q{i}", prompt(0, 1, 2), max_tokens=8).ranked_ids
               for i in range(2)]
        assert got == rankings, policy


def test_a_retried_request_does_not_count_its_own_marks_or_load():
    router = make_router()
    p = prompt(0, 1, 2, 3, 4)
    assert route(router, "q1", p, max_tokens=8).replica_id == "r0"
    assert router.index.pending_blocks("r0") == frozenset(p)
    # The retry (r0 was full) ranks again: its own marks on r0 are no hit, its load no load.
    # r0 is then as cold as the others and last on the work routed to it so far.
    assert route(router, "q1", p, max_tokens=8) == RoutingDecision(
        "r1", 0, 0, False, ("r1", "r2", "r3", "r0"))
    assert router.index.pending_blocks("r0") == frozenset()
    assert router.index.pending_blocks("r1") == frozenset(p)
    assert [router.loads.num_outstanding(r) for r in REPLICAS] == [0, 1, 0, 0]


def test_a_request_sent_further_down_the_ranking_moves_its_marks_and_load():
    router = make_router()
    snapshot(router, "r1", device=prompt(0, 1, 2, 3))
    snapshot(router, "r2", device=prompt(0, 1))
    p = prompt(0, 1, 2, 3, 4)
    assert route(router, "q1", p, max_tokens=8).ranked_ids == ("r1", "r2", "r0", "r3")
    assert router.index.pending_blocks("r1") == frozenset(prompt(4))
    assert router.loads.load("r1") == 16 + 0.1 * 64 + 8  # default cached_load_fraction
    # r1 was full; Serve sent q1 to r2
    assert router.move("q1", "r2") == RoutingDecision("r2", 32, 0, False, ("r2",))
    router.check_invariants()
    assert router.index.pending_blocks("r1") == frozenset()
    assert router.index.pending_blocks("r2") == frozenset(prompt(2, 3, 4))
    # its work left r1's recent work too
    assert (router.loads.load("r1"), router.loads.load("r2")) == (0.0, 48 + 0.1 * 32 + 8)
    assert router.move("q1", "r2") == RoutingDecision("r2", 32, 0, False, ("r2",))
    router.on_finished("q1")
    assert router.move("q1", "r0") is None  # no longer outstanding: nothing to move
    assert [router.loads.num_outstanding(r) for r in REPLICAS] == [0, 0, 0, 0]
