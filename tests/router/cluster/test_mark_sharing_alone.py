"""A router that was alone (the index actor listed no other) shares nothing; a route whose
work it did share still gets its end shared when it ends, alone or not: a router that joins
meanwhile replays the shared log, that work included (after a gap, or as a new router), and
counts it until the end comes. A route it did not share gets no end: the joiner would keep
it as an early end and swallow a retry under the same id."""

import threading
import types

import pytest

import router.cluster.index_actor as index_actor
from kv.events import EventLog
from router.cluster.index_actor import IndexActorConfig, KVIndex
from router.cluster.index_mirror import IndexMirror
from router.cluster.shared_marks import RoutedWork
from router.core.config import RouterConfig
from router.core.ledger import RouteKind
from router.core.router import Router
from tests.router.cluster.test_mark_sharing import BLOCK_SIZE, PREFIX, LocalActor, route_shared


def fleet(config: IndexActorConfig | None = None) -> KVIndex:
    index = KVIndex(config)
    for replica_id in ("r0", "r1"):
        index.publish_snapshot(EventLog(replica_id, epoch="e0").snapshot([]))
    return index


def mirror(router_id: str, actor: LocalActor) -> IndexMirror:
    return IndexMirror(Router(RouterConfig(block_size=BLOCK_SIZE)), router_id,
                       threading.Lock(), index=actor)


async def settle(*mirrors: IndexMirror, polls: int = 3) -> None:
    for _ in range(polls):
        for m in mirrors:
            assert await m.sync_once()


async def two_live_routers(monkeypatch) -> tuple[list[float], LocalActor, IndexMirror,
                                                  IndexMirror]:
    """Routers a and b, each live on the other's side, on a clock the test moves
    (`now[0]`, monotonic seconds, from 100; routers leave the live set after 10 s)."""
    now = [100.0]
    monkeypatch.setattr(index_actor, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    index = fleet(IndexActorConfig(replica_timeout_s=1e6, router_timeout_s=10.0))
    index.shared_marks._clock = lambda: now[0]
    actor = LocalActor(index)
    a, b = mirror("router-a", actor), mirror("router-b", actor)
    await settle(a, b, polls=1)
    assert await a.sync_once() and not a.alone()
    a.marks.start()
    b.marks.start()
    return now, actor, a, b


@pytest.mark.parametrize("joiner_id", ["router-b", "router-c"])  # back after expiry; new
async def test_work_shared_before_the_router_was_alone_is_ended_on_a_joiner(monkeypatch,
                                                                              joiner_id):
    now, actor, a, b = await two_live_routers(monkeypatch)
    now[0] = 109.0  # b silent since 100; the actor still lists it
    replica = route_shared(a, "q1", PREFIX, ["r0", "r1"])
    await a.marks.drain()  # q1's work is in the shared log
    now[0] = 110.5  # b left the live set: a is alone
    assert await a.sync_once() and a.alone()
    a.router.on_finished("q1")
    a.share_end("q1", replica)
    await a.marks.drain()
    now[0] = 110.8  # within the log's ttl of q1's work
    joiner = b if joiner_id == "router-b" else mirror(joiner_id, actor)
    assert await joiner.sync_once()
    assert await a.sync_once() and not a.alone()
    for _ in range(3):
        now[0] += 0.5
        await settle(joiner, a, polls=1)
    assert len(joiner.remote) == 0
    assert joiner.router.loads.num_outstanding(replica) == 0


async def test_work_shared_across_an_actor_restart_is_ended_everywhere():
    actor = LocalActor(fleet())
    a, b = mirror("router-a", actor), mirror("router-b", actor)
    await settle(a, b, polls=1)
    assert await a.sync_once() and not a.alone()
    a.marks.start()
    b.marks.start()
    actor._index = fleet()  # the actor restarted under the same handle
    replica = route_shared(a, "q1", PREFIX, ["r0", "r1"])  # a still ranks two: shared
    await a.marks.drain()
    assert await a.sync_once() and a.alone()  # its first poll of the new actor
    a.router.on_finished("q1")
    a.share_end("q1", replica)
    await a.marks.drain()
    assert await b.sync_once()  # b comes back: a gap, then q1's work
    assert await a.sync_once() and not a.alone()
    await settle(b, a)
    assert len(b.remote) == 0


async def test_a_route_not_shared_gets_no_end_that_would_swallow_its_retry():
    actor = LocalActor(fleet())
    a, b = mirror("router-a", actor), mirror("router-b", actor)
    assert await a.sync_once() and a.alone()
    a.marks.start()
    route_shared(a, "R", PREFIX, ["r0"])  # alone: not shared
    assert await b.sync_once() and await a.sync_once() and not a.alone()
    b.marks.start()
    a.router.on_finished("R")  # the attempt was rejected
    a.share_end("R", "r0")
    route_shared(a, "R", PREFIX, ["r0"])  # Serve retries it under the same id
    await a.marks.drain()
    assert await b.sync_once()
    assert b.router.loads.num_outstanding("r0") == 1


async def test_a_removed_replica_takes_its_shared_routes_with_it():
    actor = LocalActor(fleet())
    a, b = mirror("router-a", actor), mirror("router-b", actor)
    await settle(a, b, polls=1)
    assert await a.sync_once() and not a.alone()
    a.marks.start()
    replica = route_shared(a, "q1", PREFIX, ["r0", "r1"])
    assert a._work_shared == {"q1": replica}
    a.forget_replica(replica)
    assert a._work_shared == {}
    queued = len(a.marks.outbox)
    a.share_end("q1", replica)
    assert len(a.marks.outbox) == queued  # the others dropped it with the replica


def choose(m: IndexMirror, route_id: str, replica_ids: list[str]) -> str:
    """A decision as Serve's request router makes it, shared (unless alone)."""
    decision = m.router.route(route_id, PREFIX, len(PREFIX) * BLOCK_SIZE, replica_ids, 64,
                              RouteKind.CALL)
    m.share_marks(decision.replica_id, PREFIX,
                  RoutedWork(route_id, *m.router.loads.charge(route_id)))
    return decision.replica_id


async def test_a_request_chosen_again_while_alone_ends_where_it_was_shared(monkeypatch):
    """Serve chose again for a request whose ranked replicas were full: the first placement,
    shared, never ran; the second, made alone, was not shared. Its end goes to where the
    others hold it, as withdrawn."""
    now, _, a, b = await two_live_routers(monkeypatch)
    now[0] = 109.0
    assert choose(a, "X", ["r0"]) == "r0"
    await a.marks.drain()
    now[0] = 110.5  # b left the live set
    assert await a.sync_once() and a.alone()
    assert choose(a, "X", ["r1"]) == "r1"
    a.router.on_finished("X")
    a.share_end("X", "r1")
    await a.marks.drain()
    now[0] = 110.8
    assert await b.sync_once()
    assert await a.sync_once() and not a.alone()
    for _ in range(3):
        now[0] += 0.5
        await settle(b, a, polls=1)
    assert b.router.loads.num_outstanding("r0") == 0
    assert len(b.remote) == 0
