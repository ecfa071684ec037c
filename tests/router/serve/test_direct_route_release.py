"""Direct routes whose request never reached (or never ended on) the replica the router
picked: released once that replica's own stats show it idle, so an idle router's outstanding
load returns to zero (HAProxy may not use a router's answer: its config lagged behind the
replicas, or its call to the router timed out)."""

from types import SimpleNamespace

from router.serve import request_router as rr
from router.serve.request_router import KVRouteRequestRouter
from worker.api import EngineStats


def _stats(running: int, waiting: int) -> EngineStats:
    return EngineStats(num_running=running, num_waiting=waiting, num_queued_prefill_tokens=0,
                       num_blocks=64, num_used_blocks=0, num_cached_blocks=0,
                       num_pinned_blocks=0, num_free_blocks=64, num_host_blocks=0,
                       num_host_cached_blocks=0)


def _router() -> KVRouteRequestRouter:
    router = KVRouteRequestRouter.__new__(KVRouteRequestRouter)  # Serve's part unused here
    router.initialize_state(model="tiny", router={"policy": "cache_aware", "block_size": 4})
    return router


def _route(router: KVRouteRequestRouter, route_id: str, replica_id: str, at: float) -> None:
    router.router.route(route_id, [], 8, [replica_id])
    router._routed[route_id] = replica_id
    router._direct_at[route_id] = at


def test_stale_routes_on_an_idle_replica_are_released(monkeypatch):
    router = _router()
    now = 1000.0
    monkeypatch.setattr(rr.time, "monotonic", lambda: now)
    _route(router, "old-on-idle", "r1", now - 2 * rr._DIRECT_IDLE_GRACE_S)
    _route(router, "new-on-idle", "r1", now - 0.1)  # may not have reached r1 yet
    _route(router, "old-on-busy", "r2", now - 2 * rr._DIRECT_IDLE_GRACE_S)
    router._reconcile(SimpleNamespace(stats={"r1": _stats(0, 0), "r2": _stats(1, 0)}))
    assert set(router._direct_at) == {"new-on-idle", "old-on-busy"}
    assert "old-on-idle" not in router._routed
    assert router.router.loads.num_outstanding("r1") == 1  # the new one still counts
    assert router.router.loads.num_outstanding("r2") == 1


def test_nothing_is_released_without_stats_saying_idle(monkeypatch):
    router = _router()
    now = 1000.0
    monkeypatch.setattr(rr.time, "monotonic", lambda: now)
    _route(router, "old", "r1", now - 2 * rr._DIRECT_IDLE_GRACE_S)
    router._reconcile(SimpleNamespace(stats={}))
    router._reconcile(SimpleNamespace(stats={"r1": _stats(0, 1)}))
    assert set(router._direct_at) == {"old"}
