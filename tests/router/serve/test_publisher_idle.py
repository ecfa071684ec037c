"""An idle replica's publisher stays quiet: it sends a heartbeat every
`heartbeat_interval_s`, not a batch every `publish_interval_s`, and a heartbeat wakes no
router's long poll. News (events, changed stats) still goes out on the next tick."""

import asyncio
import dataclasses

import pytest

from kv.events import Cursor, contents_digest
from protocol.engine import EngineRequest, SamplingParams
from router.cluster.index_actor import KVIndex, PollRequest
from router.serve.publisher import PublisherConfig, ReplicaPublisher
from worker.engine.config import EngineConfig
from worker.engine.engine import Engine


class _Method:
    def __init__(self, fn):
        self.remote = fn


class InProcessIndex:
    """The real KVIndex, called in this process the way a Ray actor handle is called."""

    def __init__(self):
        self.index = KVIndex()
        self.num_publishes = 0
        self.publish = _Method(self._publish)
        self.publish_snapshot = _Method(self._publish_snapshot)

    async def _publish(self, *args):
        self.num_publishes += 1
        return self.index.publish(*args)

    async def _publish_snapshot(self, *args):
        return self.index.publish_snapshot(*args)


@pytest.fixture
async def engine():
    engine = Engine.from_config(EngineConfig(model="tiny", engine="sim", sim_preset="tiny",
                                             replica_id="idle-0", num_blocks=40))
    yield engine
    await engine.shutdown()


async def _tick(publisher: ReplicaPublisher, link: InProcessIndex) -> None:
    await publisher._publish(link)  # one turn of the publishing loop


async def test_idle_replica_sends_heartbeats_only(engine):
    link = InProcessIndex()
    clock = [100.0]
    publisher = ReplicaPublisher(engine, lambda: link,
                                 PublisherConfig(publish_interval_s=0.05, heartbeat_interval_s=1),
                                 clock=lambda: clock[0])
    await publisher.publish_once()  # the first publish: a new epoch asks for a snapshot
    assert (link.num_publishes, publisher.num_snapshots_sent) == (1, 1)
    for _ in range(19):  # 0.95 s of ticks with nothing new
        clock[0] += 0.05
        await _tick(publisher, link)
    assert link.num_publishes == 1
    clock[0] = 101.0  # 1 s since the last send: the heartbeat
    await _tick(publisher, link)
    assert link.num_publishes == 2

    request = EngineRequest("r0", list(range(40)), SamplingParams(max_tokens=2, temperature=0))
    async for _ in engine.generate(request):
        pass
    clock[0] += 0.05
    await _tick(publisher, link)  # blocks stored, stats changed: sent at once
    assert link.num_publishes == 3
    assert publisher.num_snapshots_sent == 1  # no gap: a skipped tick takes no sequence
    truth = engine.snapshot()
    assert truth.device_hashes
    assert link.index.replica_digests()["idle-0"] == contents_digest(truth.device_hashes,
                                                                     truth.host_hashes)


async def test_heartbeat_wakes_no_long_poll_but_news_does(engine):
    link = InProcessIndex()
    publisher = ReplicaPublisher(engine, lambda: link)
    await publisher.publish_once()
    first = await link.index.poll(PollRequest("router-a", {}))
    assert [s.replica_id for s in first.snapshots] == ["idle-0"]
    cursors = {s.replica_id: Cursor(s.epoch, s.next_seq) for s in first.snapshots}

    async def poll() -> float:
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        await link.index.poll(PollRequest("router-a", cursors, 0.3, {}))
        return loop.time() - start_s

    waiting = asyncio.create_task(poll())
    await asyncio.sleep(0)  # the poll is parked on the index's waiters
    await publisher.publish_once()  # a heartbeat: same stats, no events
    assert await waiting >= 0.3  # the poll ran its full wait: nobody woke it

    stats = engine.stats()
    waiting = asyncio.create_task(poll())
    await asyncio.sleep(0)
    busier = dataclasses.replace(stats, num_waiting=stats.num_waiting + 1)
    batch = engine.drain_events()
    link.index.publish(batch, busier)  # the stats changed: news
    assert await waiting < 0.3
