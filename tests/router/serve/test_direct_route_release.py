"""Direct routes whose request never reached (or never ended on) the replica the router
picked: released when no replica claims them within the claim window (HAProxy's client
left, HAProxy sent the request elsewhere, or nobody sent one), or once that replica's own
stats show it idle (their end was lost), so the router's load returns to its baseline."""

from types import SimpleNamespace

from ray.serve._private.common import DeploymentID, ReplicaID, RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from kv.hashing import block_hashes, namespace_root
from protocol.engine import EngineStats
from router.cluster.route_ends import claim_of, end_of, refusal_of
from router.core.ledger import LedgerConfig, RouteKind, RouteState
from router.serve.request_router import ServeRequestRouter
from router.serve.route_calls import RouteCall


def _stats(running: int, waiting: int) -> EngineStats:
    return EngineStats(num_running=running, num_waiting=waiting, num_queued_prefill_tokens=0,
                       num_blocks=64, num_used_blocks=0, num_cached_blocks=0,
                       num_pinned_blocks=0, num_free_blocks=64, num_host_blocks=0,
                       num_host_cached_blocks=0)


IDLE_GRACE_S = LedgerConfig().idle_grace_s
CLAIM_WINDOW_S = LedgerConfig().claim_window_s


def _router(now: list[float] | None = None) -> ServeRequestRouter:
    router = ServeRequestRouter.__new__(ServeRequestRouter)  # Serve's part unused here
    clock = {"clock": lambda: now[0]} if now is not None else {}
    router.initialize_state(model="tiny", router={"policy": "cache_aware", "block_size": 4},
                            **clock)
    return router


def _route(router: ServeRequestRouter, route_id: str, replica_id: str) -> None:
    router.router.route(route_id, [], 8, [replica_id], kind=RouteKind.DIRECT)
    router.routes_finished([claim_of(route_id)])  # it reached its replica
    assert router.router.ledger.get(route_id).state is RouteState.CLAIMED


def test_stale_routes_on_an_idle_replica_are_released():
    now = [1000.0 - 2 * IDLE_GRACE_S]
    router = _router(now)
    _route(router, "old-on-idle", "r1")
    _route(router, "old-on-busy", "r2")
    now[0] = 1000.0 - 0.1
    _route(router, "new-on-idle", "r1")  # may not have reached r1 yet
    now[0] = 1000.0
    router._reconcile(SimpleNamespace(stats={"r1": _stats(0, 0), "r2": _stats(1, 0)}))
    assert set(router.router.ledger) == {"new-on-idle", "old-on-busy"}
    assert router.router.loads.num_outstanding("r1") == 1  # the new one still counts
    assert router.router.loads.num_outstanding("r2") == 1


def test_nothing_is_released_without_stats_saying_idle():
    now = [1000.0 - 2 * IDLE_GRACE_S]
    router = _router(now)
    _route(router, "old", "r1")
    now[0] = 1000.0
    router._reconcile(SimpleNamespace(stats={}))
    router._reconcile(SimpleNamespace(stats={"r1": _stats(0, 1)}))
    assert set(router.router.ledger) == {"old"}


DEPLOYMENT = DeploymentID(name="EngineReplica", app_name="kvroute")
CANDIDATES = [SimpleNamespace(replica_id=ReplicaID(name, DEPLOYMENT)) for name in ("a", "b")]
BUSY = SimpleNamespace(stats={"a": _stats(3, 1), "b": _stats(3, 1)})


async def _route_direct(router: ServeRequestRouter, route_id: str, max_tokens: int) -> str:
    tokens = list(range(3, 67))
    call = RouteCall(route_id, tokens, block_hashes(tokens, 4, namespace_root("tiny")),
                     max_tokens)
    ranks = await router.choose_replicas(
        CANDIDATES, PendingRequest([call], {}, RequestMetadata(route_id, route_id)))
    return ranks[0][0].replica_id.unique_id


def _load(router: ServeRequestRouter) -> float:
    return sum(router.router.loads.load(r) for r in ("a", "b"))


async def test_a_route_no_replica_claims_is_withdrawn_after_the_claim_window():
    """HAProxy's client left before the request was sent, or nobody sent it (a call to
    /internal/route alone): on a busy replica too, its load goes within seconds."""
    now = [1000.0]
    router, alone = _router(now), _router(now)  # alone: routes only "running"
    for r in (router, alone):
        r._started = r._pushing = True  # no index actor here
        r.mirror.num_polls = 1
        await _route_direct(r, "running", max_tokens=8)
        r.routes_finished([claim_of("running")])
    await _route_direct(router, "never-sent", max_tokens=2000)
    assert router.router.ledger.get("never-sent").kind is RouteKind.DIRECT
    now[0] += CLAIM_WINDOW_S - 0.5
    router._reconcile(BUSY)
    assert set(router.router.ledger) == {"never-sent", "running"}
    now[0] += 1.0
    router._reconcile(BUSY)
    assert set(router.router.ledger) == {"running"}
    assert router.router.loads._requests.keys() == {"running"}
    # nothing of "never-sent" stayed, its recent work included
    assert _load(router) == _load(alone) > 0


async def test_a_refused_route_takes_back_all_it_charged():
    router = _router()
    router._started = router._pushing = True
    router.mirror.num_polls = 1
    await _route_direct(router, "refused", max_tokens=2000)
    assert _load(router) > 2000
    router.routes_finished([claim_of("refused"), refusal_of("refused")])
    assert _load(router) == 0.0 and not router.router.ledger


async def test_an_end_reported_for_a_serve_calls_id_releases_nothing():
    """Ends reported through the index actor are direct routes' only: an id that names a
    Serve call (which its completion callback ends) is not taken for one."""
    router = _router()
    router._started = router._pushing = True
    router.mirror.num_polls = 1
    router.router.route("call-1", [], 8, ["a"], kind=RouteKind.CALL)
    router.routes_finished([claim_of("call-1"), "call-1", refusal_of("call-1")])
    assert router.router.ledger.get("call-1").state is RouteState.ROUTED
    assert router.router.loads.num_outstanding("a") == 1


def _miss_tokens(router: ServeRequestRouter) -> dict[str, float]:
    return {s.labels["cause"]: s.value for m in router.metrics.registry.collect()
            if m.name == "kvroute_miss_tokens" for s in m.samples
            if s.name == "kvroute_miss_tokens_total"}


async def test_an_ended_route_counts_its_miss_causes_from_the_engines_cached_tokens():
    router = _router()
    router._started = router._pushing = True
    router.mirror.num_polls = 1
    assert _miss_tokens(router) == {"cold": 0, "capacity": 0, "placement": 0, "race": 0}
    await _route_direct(router, "first", max_tokens=8)  # 64 tokens nobody saw
    router.routes_finished([claim_of("first"), end_of("first", 0)])
    await _route_direct(router, "no-count", max_tokens=8)
    router.routes_finished([claim_of("no-count"), "no-count"])  # the engine sent none
    await _route_direct(router, "refused", max_tokens=8)
    router.routes_finished([claim_of("refused"), refusal_of("refused")])
    assert _miss_tokens(router) == {"cold": 64, "capacity": 0, "placement": 0, "race": 0}
    assert router.router.misses.num_outstanding() == 0


async def test_a_direct_route_ended_through_the_actor_leaves_no_end_to_share():
    """The actor relays a direct route's end (or refusal) to the other routers itself: the
    deciding router keeps no record of the route's shared work after it, nor sends an end."""
    router = _router()
    router._started = router._pushing = True  # no index actor here
    router.mirror.num_polls = 1
    for route_id in ("ended", "refused", "running"):
        await _route_direct(router, route_id, max_tokens=8)
    assert set(router.mirror._work_shared) == {"ended", "refused", "running"}
    queued = len(router.mirror.marks.outbox)
    router.routes_finished([claim_of("ended"), end_of("ended", 0), refusal_of("refused")])
    assert set(router.mirror._work_shared) == {"running"}
    assert len(router.mirror.marks.outbox) == queued  # no end of its own queued
