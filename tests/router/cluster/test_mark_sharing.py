"""Two routers' index mirrors on one index actor (a real KVIndex, called as Ray would): the
pending marks one router sets reach the other, which routes the same prefix after them; the
work one routes joins the other's load until its end."""

import asyncio
import os
import threading

import pytest

from kv.events import EventLog
from router.cluster.actor_link import ActorLink
from router.cluster.index_actor import KVIndex
from router.cluster.index_mirror import IndexMirror, MirrorConfig
from router.cluster.mark_sharing import (
    MarkOutbox,
    MarkSender,
    MarkSharingConfig,
    apply_shared_marks,
)
from router.cluster.remote_work import RemoteWork
from router.cluster.shared_marks import (
    RoutedWork,
    SharedGap,
    SharedMark,
    SharedMarks,
    SharedMarksConfig,
    WorkEnd,
)
from router.core.config import RouterConfig
from router.core.router import Router

BLOCK_SIZE = 16
PREFIX = [os.urandom(16) for _ in range(8)]


class _Method:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args):
        async def call():
            result = self._fn(*args)
            return await result if asyncio.iscoroutine(result) else result
        return call()


class LocalActor:
    """The KVIndex behind the `.method.remote(...)` calls a Ray actor handle takes."""

    def __init__(self, index: KVIndex):
        self._index = index

    def __getattr__(self, name: str) -> _Method:
        return _Method(getattr(self._index, name))


async def know_each_other(mirrors: list[IndexMirror]) -> tuple[IndexMirror, IndexMirror]:
    """The first router polls again after the second registered (live, the actor wakes its
    waiting poll for that): a router that knows it is alone shares nothing."""
    assert mirrors[0].alone()
    assert await mirrors[0].sync_once()
    assert not mirrors[0].alone() and not mirrors[1].alone()
    return mirrors[0], mirrors[1]


async def two_routers(share_marks: bool) -> tuple[IndexMirror, IndexMirror]:
    index = KVIndex()
    for rid in ("r0", "r1"):
        index.publish_snapshot(EventLog(rid, epoch="e0").snapshot([]))
    mirrors = []
    for router_id in ("router-a", "router-b"):
        router = Router(RouterConfig(block_size=BLOCK_SIZE))
        mirror = IndexMirror(router, router_id, threading.Lock(), index=LocalActor(index),
                             config=MirrorConfig(share_marks=share_marks))
        assert await mirror.sync_once()
        assert router.index.replica_ids == ["r0", "r1"]
        mirror.marks.start()  # the sends only: each test polls by hand
        mirrors.append(mirror)
    return await know_each_other(mirrors)


def route(mirror: IndexMirror, request_id: str, replica_ids: list[str]) -> str:
    decision = mirror.router.route(request_id, PREFIX, len(PREFIX) * BLOCK_SIZE, replica_ids)
    mirror.share_marks(decision.replica_id, PREFIX)
    return decision.replica_id


@pytest.mark.parametrize("share_marks, expected", [(True, "r1"), (False, "r0")])
async def test_the_second_router_follows_the_prefix_the_first_just_routed(share_marks,
                                                                           expected):
    a, b = await two_routers(share_marks)
    # Nothing is cached and nothing is loaded: each router takes its first candidate.
    assert route(a, "q1", ["r1", "r0"]) == "r1"
    await a.marks.drain()
    await b.sync_once()
    assert route(b, "q2", ["r0", "r1"]) == expected
    await b.marks.drain()
    assert (await b.poll_once()).shared_marks == ()  # a router never gets its own back
    assert (await a.poll_once()).shared_marks == (
        (SharedMark(expected, tuple(PREFIX)),) if share_marks else ())
    assert a.marks.num_sends == b.marks.num_sends == (1 if share_marks else 0)
    # the counts kvroute_router_shared_decisions_total follows: one decision each way
    assert a.marks.num_shared_decisions == a.num_shared_received == (1 if share_marks else 0)


async def test_a_lone_router_sends_nothing_until_another_polls():
    index = KVIndex()
    index.publish_snapshot(EventLog("r0", epoch="e0").snapshot([]))
    mirrors = [IndexMirror(Router(RouterConfig(block_size=BLOCK_SIZE)), router_id,
                           threading.Lock(), index=LocalActor(index))
               for router_id in ("router-a", "router-b")]
    a, b = mirrors
    assert await a.sync_once()
    a.marks.start()
    route(a, "q1", ["r0"])
    a.share_end("q1", "r0")
    await a.marks.drain()
    assert a.marks.num_sends == a.marks.num_shared_decisions == 0  # nobody to read them
    assert await b.sync_once() and await a.sync_once()
    route(a, "q2", ["r0"])
    await a.marks.drain()
    assert a.marks.num_sends == a.marks.num_shared_decisions == 1
    assert await b.sync_once() and b.num_shared_received == 1


def test_blocks_confirmed_here_are_not_marked_and_unknown_replicas_are_skipped():
    router = Router(RouterConfig(block_size=BLOCK_SIZE))
    router.apply_snapshot(EventLog("r0", epoch="e0").snapshot(PREFIX[:3]))
    router.apply_snapshot(EventLog("r1", epoch="e0").snapshot([]))
    router.set_replica_approximate("r1", True)
    marks = (SharedMark("r0", tuple(PREFIX)), SharedMark("r1", tuple(PREFIX)),
             SharedMark("r9", tuple(PREFIX)), SharedMark("r2", tuple(PREFIX)))
    assert apply_shared_marks(router, marks, skip=lambda rid: rid == "r2") == 5
    assert router.index.pending_blocks("r0") == frozenset(PREFIX[3:])
    assert router.index.pending_blocks("r1") == frozenset()  # routed on history
    assert "r9" not in router.index  # a replica this router does not know is not created
    router.check_invariants()


def test_the_outbox_drops_its_oldest_marks_past_its_bound():
    outbox = MarkOutbox(max_blocks=5)
    outbox.add("r0", tuple(PREFIX[:3]))
    outbox.add("r1", tuple(PREFIX[3:6]))
    assert outbox.num_dropped_blocks == 3
    assert outbox.take() == (SharedMark("r1", tuple(PREFIX[3:6])),)
    assert len(outbox) == 0


def test_past_its_bound_the_outbox_drops_hashes_before_any_work_or_end():
    # A dropped mark costs a prefill at worst; a dropped end leaves its route counted on the
    # other routers for lost_after_s (600 s) while its replica is busy.
    outbox = MarkOutbox(max_blocks=5)
    w0, w1 = RoutedWork("q0", 100.0, 20.0, 100.0), RoutedWork("q1", 50.0, 20.0, 50.0)
    outbox.add("r0", tuple(PREFIX[:3]), w0)
    outbox.put(WorkEnd("q9", "r0"))
    outbox.add("r1", tuple(PREFIX[3:6]), w1)  # 7 > 5: the oldest mark's hashes go
    assert outbox.num_dropped_blocks == 3
    assert outbox.take() == (SharedMark("r0", (), w0), WorkEnd("q9", "r0"),
                             SharedMark("r1", tuple(PREFIX[3:6]), w1))
    for i in range(7):  # work and ends alone past the bound: the oldest go
        outbox.put(WorkEnd(f"e{i}", "r0"))
    assert outbox.take() == tuple(WorkEnd(f"e{i}", "r0") for i in range(2, 7))
    assert (outbox.num_dropped_blocks, outbox.num_dropped_work) == (3, 2)


class Clock:
    def __init__(self):
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


async def two_sharing_work(clock: Clock, share_work: bool = True
                           ) -> tuple[IndexMirror, IndexMirror]:
    index = KVIndex()
    for rid in ("r0", "r1"):
        index.publish_snapshot(EventLog(rid, epoch="e0").snapshot([]))
    mirrors = []
    for router_id in ("router-a", "router-b"):
        router = Router(RouterConfig(block_size=BLOCK_SIZE), clock)
        mirror = IndexMirror(router, router_id, threading.Lock(), index=LocalActor(index),
                             config=MirrorConfig(share_work=share_work))
        assert await mirror.sync_once()
        mirror.marks.start()
        mirrors.append(mirror)
    return await know_each_other(mirrors)


def route_shared(mirror: IndexMirror, request_id: str, prompt: list[bytes],
                 replica_ids: list[str], max_tokens: int = 64) -> str:
    """A decision and what the request router shares of it (request_router.py)."""
    router = mirror.router
    decision = router.route(request_id, prompt, len(prompt) * BLOCK_SIZE, replica_ids,
                            max_tokens)
    charge = router.loads.charge(request_id)
    mirror.share_marks(decision.replica_id, prompt, RoutedWork(request_id, *charge))
    return decision.replica_id


@pytest.mark.parametrize("share_work, expected", [(True, "r0"), (False, "r1")])
async def test_the_second_router_counts_the_work_the_first_routed(share_work, expected):
    clock = Clock()
    a, b = await two_sharing_work(clock, share_work)
    other = [os.urandom(16) for _ in range(8)]  # a prefix nobody holds
    assert route_shared(a, "q1", PREFIX, ["r1", "r0"]) == "r1"
    await a.marks.drain()
    await b.sync_once()
    # b's load counts a's request as a's does; without it both replicas look idle to b
    # and it takes its first candidate, onto the request a just sent there
    assert b.router.loads.load("r1") == (a.router.loads.load("r1") if share_work else 0.0)
    assert route_shared(b, "q2", other, ["r1", "r0"]) == expected
    # its own outstanding count (the gauge's) is its own request only
    assert [b.router.loads.num_outstanding(r) - b.remote.num_on(r) for r in ("r0", "r1")] == (
        [1, 0] if share_work else [0, 1])
    b.remote.check_invariants()


@pytest.mark.parametrize("withdrawn", [False, True])
async def test_a_shared_end_takes_the_work_back_off_the_other_routers(withdrawn):
    clock = Clock()
    a, b = await two_sharing_work(clock)
    route_shared(a, "q1", PREFIX, ["r1", "r0"])
    await a.marks.drain()
    await b.sync_once()
    charged = b.router.loads.load("r1")
    assert charged > 0 and len(b.remote) == 1
    if withdrawn:  # it never ran: its recent work goes too
        a.router.withdraw("q1")
    else:
        a.router.on_finished("q1")
    a.share_end("q1", "r1", withdrawn=withdrawn)
    await a.marks.drain()
    await b.sync_once()
    assert len(b.remote) == 0 and b.router.loads.num_outstanding("r1") == 0
    # the clock stood still: what is left is the recent work, as on the router that sent it
    assert b.router.loads.load("r1") == a.router.loads.load("r1") == (0.0 if withdrawn
                                                                        else charged)
    b.remote.check_invariants()


class _HeldCalls:
    """An index actor whose `share_marks` calls wait until released, as slow round trips."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.release = asyncio.Event()
        self.share_marks = self

    def remote(self, router_id, marks):
        self.calls.append(marks)

        async def call():
            await self.release.wait()
        return call()


async def test_a_mark_does_not_wait_for_the_previous_calls_round_trip():
    index = _HeldCalls()
    sender = MarkSender("router-a", ActorLink("test", lambda: index, index),
                        MarkSharingConfig(max_sends_in_flight=2))
    sender.start()
    sender.share("r0", PREFIX[:2])
    await asyncio.sleep(0)  # the decision's turn of the loop ends: its send starts
    sender.share("r1", PREFIX[2:4])  # the first call has not come back
    await asyncio.sleep(0)
    assert index.calls == [(SharedMark("r0", tuple(PREFIX[:2])),),
                           (SharedMark("r1", tuple(PREFIX[2:4])),)]
    sender.share("r0", PREFIX[4:5])  # two in flight: this one waits, and batches
    sender.share_end("q1", "r0")
    await asyncio.sleep(0)
    assert len(index.calls) == 2
    index.release.set()
    await sender.drain()
    assert index.calls[2] == (SharedMark("r0", tuple(PREFIX[4:5])), WorkEnd("q1", "r0"))
    assert sender.num_sends == 3 and len(sender.outbox) == 0


def test_ends_the_actor_dropped_unseen_take_the_remote_routes_with_them():
    # b polls late (a stalled loop, a failed poll): a's end was older than the actor's TTL
    # and is gone. Had b kept q1, it would count it on r0 for lost_after_s (600 s) while r0
    # stays busy; told that it missed messages, it drops what it cannot know ended.
    clock = Clock()
    log = SharedMarks(SharedMarksConfig(ttl_s=2.0), clock=clock)
    router = Router(RouterConfig(block_size=BLOCK_SIZE), clock)
    remote = RemoteWork(router.loads, clock=clock)
    assert log.take("b") == (SharedGap(None),)
    log.add("a", [SharedMark("r0", (), RoutedWork("q1", 300.0, 20.0, 300.0))])
    apply_shared_marks(router, log.take("b"), lambda rid: False, remote)
    assert remote.num_on("r0") == 1
    log.add("a", [WorkEnd("q1", "r0")])
    clock.now_s += 2.5
    log.add("a", [SharedMark("r1", (), RoutedWork("q2", 100.0, 20.0, 100.0))])
    missed = log.take("b")
    assert missed == (SharedGap(1), SharedMark("r1", (), RoutedWork("q2", 100.0, 20.0, 100.0)))
    apply_shared_marks(router, missed, lambda rid: False, remote)
    assert (remote.num_on("r0"), remote.num_on("r1"), remote.num_lost) == (0, 1, 1)
    assert router.loads.num_outstanding("r0") == 0
    assert log.take("b") == ()  # caught up: no gap
    remote.check_invariants()


async def test_a_restarted_index_actor_takes_the_remote_routes_with_it():
    # the actor's log, with the ends of the routes b counts, went with the actor
    clock = Clock()
    a, b = await two_sharing_work(clock)
    route_shared(a, "q1", PREFIX, ["r1", "r0"])
    await a.marks.drain()
    await b.sync_once()
    assert len(b.remote) == 1
    restarted = KVIndex()
    restarted.publish_snapshot(EventLog("r1", epoch="e0").snapshot([]))
    b._index = ActorLink("test", lambda: LocalActor(restarted), LocalActor(restarted))
    await b.sync_once()
    assert len(b.remote) == 0 and b.router.loads.num_outstanding("r1") == 0
    b.remote.check_invariants()


async def test_a_stopped_sender_sends_nothing_more():
    index = _HeldCalls()
    sender = MarkSender("router-a", ActorLink("test", lambda: index, index),
                        MarkSharingConfig(max_sends_in_flight=1))
    sender.start()
    sender.share("r0", PREFIX[:2])
    await asyncio.sleep(0)  # its call is in flight
    sender.share("r1", PREFIX[2:4])  # queued behind it
    sender.stop()
    for _ in range(3):  # the cancelled call ends; its end must not start the queued one
        await asyncio.sleep(0)
    assert index.calls == [(SharedMark("r0", tuple(PREFIX[:2])),)]
    assert len(sender.outbox) == 1
    index.release.set()
    await sender.drain()
