"""Batches that travel packed as columns count as news wherever objects did: the view a
mirror reports to the index actor (its index's digest per replica, which the convergence
checks compare with the replicas' own) follows them, and the actor's long poll answers at
once when they are waiting."""

import os
import threading

from kv.events import BlockStored, Cursor, EventLog
from router.cluster.index_actor import KVIndex, PollRequest
from router.cluster.index_mirror import IndexMirror, MirrorConfig
from router.core.config import RouterConfig
from router.core.router import Router
from tests.router.cluster.test_mark_sharing import LocalActor

HELD = [os.urandom(16) for _ in range(3)]


async def test_the_view_follows_packed_batches():
    index = KVIndex()
    log = EventLog("r0", epoch="e0")
    index.publish_snapshot(log.snapshot(HELD))
    router = Router(RouterConfig(block_size=16))
    mirror = IndexMirror(router, "router-a", threading.Lock(), index=LocalActor(index),
                         config=MirrorConfig(view_refresh_s=1e-9))
    assert await mirror.sync_once()
    await mirror.poll_once()  # reports the view of the snapshot
    assert mirror._digests()["r0"].num_device_blocks == 3
    log.append(BlockStored((os.urandom(16),), HELD[-1]))
    index.publish(log.drain())
    reply = await mirror.poll_once()
    assert reply.packed is not None and not reply.batches  # the batch came as columns
    assert len(router.index.blocks_of("r0")) == 4
    assert mirror._digests()["r0"].num_device_blocks == 4


def _answers_without_waiting(index: KVIndex, request: PollRequest):
    """The long poll's reply when it needs no await (news was there), else None."""
    coro = index.poll(request)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    return None


async def test_a_long_poll_with_packed_news_answers_at_once():
    index = KVIndex()
    log = EventLog("r0", epoch="e0")
    snap = log.snapshot(HELD)
    index.publish_snapshot(snap)
    cursor = {"r0": Cursor(snap.epoch, snap.next_seq)}
    idle = PollRequest("router-a", cursor, wait_s=30.0, packed=True)
    assert _answers_without_waiting(index, idle) is not None  # a new router: told at once
    assert _answers_without_waiting(index, idle) is None  # nothing new: it waits
    log.append(BlockStored((os.urandom(16),), HELD[-1]))
    index.publish(log.drain())
    reply = _answers_without_waiting(index, idle)
    assert reply is not None and len(reply.packed) == 1
