"""A direct request's end, from its engine replica to the ledger of the router that routed it:
sent when it ends (not with the next publish), through the real KV index and the router's
index mirror; and once the replica's death released its routes, a late end changes nothing."""

from types import SimpleNamespace

import pytest
from ray.serve._private.common import DeploymentID, ReplicaID, RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from kv.hashing import block_hashes, namespace_root
from router.cluster.index_actor import KVIndex
from router.cluster.route_ends import claim_of, end_of
from router.cluster.shared_marks import WorkEnd
from router.serve.publisher import PublisherConfig, ReplicaPublisher
from router.serve.request_router import ServeRequestRouter
from router.serve.route_calls import RouteCall
from router.serve.route_header import Route
from router.serve.route_tracking import RouteReports
from worker.engine.config import EngineConfig
from worker.engine.engine import Engine

DEPLOYMENT = DeploymentID(name="EngineReplica", app_name="kvroute")
CANDIDATES = [SimpleNamespace(replica_id=ReplicaID(name, DEPLOYMENT)) for name in ("a", "b")]


class _Method:
    def __init__(self, fn):
        self.remote = fn


class InProcessIndex:
    """The real KVIndex, called the way a Ray actor handle is called."""

    def __init__(self):
        self.index = KVIndex()
        self.calls: list[str] = []
        for name in ("publish", "publish_snapshot", "report_routes", "poll", "forget_replica"):
            self._expose(name)

    def _expose(self, name: str) -> None:
        method = getattr(self.index, name)

        async def call(*args):
            self.calls.append(name)
            result = method(*args)
            return (await result) if hasattr(result, "__await__") else result
        setattr(self, name, _Method(call))


@pytest.fixture
async def engine():
    engine = Engine.from_config(EngineConfig(model="tiny", engine="sim", sim_preset="tiny",
                                             replica_id="a", num_blocks=40))
    yield engine
    await engine.shutdown()


def _router() -> ServeRequestRouter:
    router = ServeRequestRouter.__new__(ServeRequestRouter)  # Serve's part unused here
    router.initialize_state(model="tiny", router={"policy": "cache_aware", "block_size": 4})
    router._started = router._pushing = True
    router.mirror.num_polls = 1  # polled by hand here
    return router


async def _route_direct(router: ServeRequestRouter, route_id: str, first_token: int = 3
                        ) -> str:
    tokens = list(range(first_token, first_token + 64))
    call = RouteCall(route_id, tokens, block_hashes(tokens, 4, namespace_root("tiny")), 8)
    ranks = await router.choose_replicas(
        CANDIDATES, PendingRequest([call], {}, RequestMetadata(route_id, route_id)))
    return ranks[0][0].replica_id.unique_id


async def test_an_end_reaches_the_routers_ledger_without_waiting_for_a_publish(engine):
    index, router, reports = InProcessIndex(), _router(), RouteReports()
    await router.mirror._poll(index, 0.0)  # the router is known to the index
    # no periodic publish comes within the test after the first: only the end's own can
    publisher = ReplicaPublisher(engine, lambda: index,
                                 PublisherConfig(publish_interval_s=3600,
                                                 heartbeat_interval_s=3600), reports)
    publisher.start()
    await publisher.publish_once()  # after the loop's first: one publish at a time
    replica_id = await _route_direct(router, "q1")
    route = Route(router.gateway_id, "q1")
    reports.claim(route)  # it reached its replica: goes with the end or a publish
    published = index.calls.count("publish")
    reports.end(route, cached_tokens=0, output_tokens=8)
    await publisher.drain_reports()  # no publish due: the end goes alone
    assert index.calls.count("publish") == published
    assert index.calls.count("report_routes") == 1
    assert router.router.loads.num_outstanding(replica_id) == 1
    router.mirror.marks.outbox.take()  # the decision's marks, shared
    await router.mirror._poll(index, 0.0)
    assert "q1" not in router.router.ledger
    assert router.router.loads.num_outstanding(replica_id) == 0
    # the other routers had the end from the actor: this router sends none back
    assert not [m for m in router.mirror.marks.outbox.take() if isinstance(m, WorkEnd)]
    await publisher.stop("a")


async def test_an_end_after_its_replicas_death_changes_nothing():
    router = _router()
    replica_id = await _route_direct(router, "q1")
    other = "b" if replica_id == "a" else "a"
    assert await _route_direct(router, "q2", 100) == other  # untouched throughout
    router.routes_finished([claim_of("q1"), claim_of("q2")])
    router.mirror.marks.outbox.take()  # the decisions' marks, shared
    router._drop_replica(replica_id, dead=False)  # the death path releases q1
    assert "q1" not in router.router.ledger
    assert router.router.loads.num_outstanding(replica_id) == 0
    before = router.router.loads.load(other)
    router.routes_finished([end_of("q1", 0, 8)])  # its end, reported late
    assert router.router.loads.load(other) == before and "q2" in router.router.ledger
    assert not [m for m in router.mirror.marks.outbox.take() if isinstance(m, WorkEnd)]
    router.router.ledger.check_invariants()
