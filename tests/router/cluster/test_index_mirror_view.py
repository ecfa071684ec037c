"""The view a mirror reports to the index actor (its index's digest per replica, which the
convergence checks compare with the replicas' own) follows every poll that changed the
index, batches that came packed as columns included."""

import os
import threading

from kv.events import BlockStored, EventLog
from router.cluster.index_actor import KVIndex
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
