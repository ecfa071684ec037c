"""A replica this router saw leave (Serve stopped listing it) while the index actor still
lists it: its data is skipped here, its position in the actor's log is kept, so the actor
answers the next polls with deltas (and waits for news), not with its whole snapshot at
once, poll after poll; Serve listing it again brings its index back."""

import os
import threading

from kv.events import BlockStored, EventLog
from router.cluster.index_actor import KVIndex
from router.cluster.index_mirror import IndexMirror
from router.core.config import RouterConfig
from router.core.router import Router
from tests.router.cluster.test_mark_sharing import LocalActor

HELD = [os.urandom(16) for _ in range(3)]


async def test_a_gone_replica_the_actor_still_lists_comes_as_deltas_and_comes_back():
    index = KVIndex()
    logs = {rid: EventLog(rid, epoch="e0") for rid in ("r0", "r1")}
    for log in logs.values():
        index.publish_snapshot(log.snapshot(HELD))
    router = Router(RouterConfig(block_size=16))
    mirror = IndexMirror(router, "router-a", threading.Lock(), index=LocalActor(index))
    assert await mirror.sync_once()
    mirror.forget_replica("r1")  # Serve stopped listing it; it still publishes
    reply = await mirror.poll_once()
    assert reply.snapshots == ()  # was: r1's snapshot, answered at once, every poll
    new_block = os.urandom(16)
    logs["r1"].append(BlockStored((new_block,), HELD[-1]))
    index.publish(logs["r1"].drain())
    reply = await mirror.poll_once()  # r1's new events, as a delta, skipped here
    assert reply.snapshots == () and router.index.replica_ids == ["r0"]
    mirror.revive("r1")  # Serve lists it again
    reply = await mirror.poll_once()
    assert [s.replica_id for s in reply.snapshots] == ["r1"]
    assert router.index.replica_ids == ["r0", "r1"]
    assert router.index.blocks_of("r1") == frozenset([*HELD, new_block])
