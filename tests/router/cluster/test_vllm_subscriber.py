"""The subscriber follows a mock vLLM worker that publishes, drops and replays events; the
index (ReplicaLog, as the KV index actor keeps it) converges to the worker's contents."""

import asyncio
import time
from contextlib import asynccontextmanager

import msgspec
import pytest

from kv.events import BlockStored, EventBatch
from kv.hashing import block_hashes, namespace_root
from protocol.vllm import wire
from router.cluster.replica_log import ReplicaLog
from router.cluster.vllm_subscriber import VllmEventSubscriber
from router.cluster.vllm_subscriber_spec import (
    APPROXIMATE,
    EVENTS,
    SubscriberConfig,
    SubscriberSpec,
)
from router.core.engine_hash_map import EngineHashConfig
from tests.router.cluster.mock_vllm_worker import MockVllmWorker
from worker.vllm_events.publisher import VllmEventPublisher, VllmPublisherConfig

MODEL, B = "m", 16
ROOT = namespace_root(MODEL)


def tokens(seed: int, num_blocks: int) -> list[int]:
    return [(seed * 1000 + i) % 30000 for i in range(num_blocks * B)]


def router_hashes(token_ids: list[int]) -> list[bytes]:
    return block_hashes(token_ids, B, ROOT)


def stored(hashes, parent, token_ids, medium="GPU"):
    return wire.BlockStored(block_hashes=hashes, parent_block_hash=parent,
                            token_ids=token_ids, block_size=B, lora_id=None, medium=medium,
                            lora_name=None)


def removed(hashes, medium="GPU"):
    return wire.BlockRemoved(block_hashes=hashes, medium=medium)


class LogSink:
    """The KV index actor's per-replica ReplicaLog, fed the way the actor feeds it."""

    def __init__(self):
        self.log = ReplicaLog("w")

    def publish(self, batch):
        return self.log.publish(batch)

    def publish_snapshot(self, snap):
        self.log.apply_snapshot(snap)

    def contents(self):
        self.log.check_invariants()
        return {m: set(h) for m, h in self.log.contents.items()}


async def until(condition, timeout_s: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@asynccontextmanager
async def following(worker, stale_after_s: float = 30.0):
    sink = LogSink()
    spec = SubscriberSpec("w", worker.endpoint, EngineHashConfig(MODEL, B),
                              worker.replay_endpoint)
    sub = VllmEventSubscriber(spec, sink, SubscriberConfig(stale_after_s=stale_after_s,
                                                           replay_timeout_s=1.0))
    task = asyncio.get_running_loop().create_task(sub.run())
    try:
        yield sub, sink
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def started(sub, worker):
    await until(lambda: sub.next_seq is not None, what="the first resync")
    assert await asyncio.to_thread(worker.wait_subscribed)


@pytest.mark.parametrize("replay_shape", ["0.33.0", "0.22.1"])
async def test_dropped_batches_are_replayed_and_the_index_converges(replay_shape):
    worker = MockVllmWorker(replay_shape=replay_shape)
    a, b = tokens(1, 3), tokens(2, 2)
    ra, rb = router_hashes(a), router_hashes(b)
    async with following(worker) as (sub, sink):
        await started(sub, worker)
        assert sub.mode == EVENTS  # an empty replay buffer: nothing published yet
        worker.publish([stored([b"a0", b"a1"], None, a[:32])])
        worker.publish([stored([b"a2"], b"a1", a[32:])], drop=True)
        worker.publish([stored([b"b0", b"b1"], None, b)], drop=True)
        worker.publish([removed([b"a0"])])
        worker.publish([removed([b"b1"])], drop=True)
        worker.publish([stored([b"a2"], b"a1", a[32:], medium="CPU")])
        await until(lambda: sub.next_seq == 6, what="seq 5")
        assert sink.contents() == {"device": {ra[1], ra[2], rb[0]}, "host": {ra[2]}}
        assert (sub.stats.num_gaps_replayed, sub.stats.num_gaps_lost) == (2, 0)
        assert sub.mode == EVENTS
    worker.close()


async def test_a_gap_replay_cannot_fill_leaves_a_subset_until_the_cache_is_cleared():
    worker = MockVllmWorker(buffer_steps=2)
    a, c, d, e = tokens(1, 1), tokens(3, 1), tokens(4, 1), tokens(5, 1)
    async with following(worker) as (sub, sink):
        await started(sub, worker)
        worker.publish([stored([b"a"], None, a)])
        worker.publish([removed([b"a"])], drop=True)
        worker.publish([stored([b"c"], None, c)], drop=True)
        worker.publish([stored([b"c2"], None, tokens(6, 1))], drop=True)  # buffer: 3..
        worker.publish([stored([b"d"], None, d)])
        await until(lambda: sub.next_seq == 5, what="seq 4")
        # seqs 1..2 are gone from the buffer: restarted from empty at the live batch. "c" is
        # cached but unknown (a subset), and "a", removed meanwhile, is not kept.
        assert sink.contents() == {"device": set(router_hashes(d)), "host": set()}
        assert (sub.stats.num_gaps_lost, sub.mode) == (1, APPROXIMATE)
        worker.publish([wire.AllBlocksCleared(), stored([b"e"], None, e)])
        await until(lambda: sub.next_seq == 6, what="seq 5")
        assert sink.contents() == {"device": set(router_hashes(e)), "host": set()}
        assert sub.mode == EVENTS
    worker.close()


async def test_malformed_and_unknown_payloads_are_counted_and_never_stop_it():
    worker = MockVllmWorker()
    a, b = tokens(1, 1), tokens(2, 1)
    async with following(worker) as (sub, sink):
        await started(sub, worker)
        worker.publish([stored([b"a"], None, a)])
        worker.send_raw([b"", b"\x00\x01"])  # not [topic, seq, payload]
        worker.publish([], payload=b"\x93\xcb garbage")
        unknown = {"type": "BlockPromoted", "block_hashes": [b"a"]}  # a future event type
        worker.publish([], payload=msgspec.msgpack.encode([time.time(), [
            msgspec.Raw(msgspec.msgpack.encode(unknown)),
            msgspec.Raw(msgspec.msgpack.encode(stored([b"b"], None, b)))]]))
        await until(lambda: sub.next_seq == 3, what="seq 2")
        assert (sub.stats.num_malformed, sub.stats.num_unknown_events) == (2, 1)
        # The garbage batch's effect is unknown: the view restarted from empty after it.
        assert sink.contents() == {"device": set(router_hashes(b)), "host": set()}
        assert sub.mode == APPROXIMATE
    worker.close()


async def test_silence_is_probed_then_falls_back_and_resyncs_on_the_next_batch():
    worker = MockVllmWorker()
    a, b = tokens(1, 1), tokens(2, 1)
    async with following(worker, stale_after_s=0.2) as (sub, sink):
        await started(sub, worker)
        worker.publish([stored([b"a"], None, a)])
        await until(lambda: worker.num_replays >= 4, what="probes of an idle worker")
        assert sub.mode == EVENTS  # idle, and answering: nothing lost
        worker.answer_replays = False  # hung, or its replay socket unreachable
        await until(lambda: sub.mode == APPROXIMATE, what="the fallback")
        assert sink.contents()["device"] == set(router_hashes(a))  # kept: nothing was lost
        worker.answer_replays = True
        worker.publish([stored([b"b"], None, b)])
        await until(lambda: sub.mode == EVENTS, what="the resync")
        assert sink.contents()["device"] == set(router_hashes(a) + router_hashes(b))
    worker.close()


async def test_a_restarted_worker_is_followed_from_its_new_seq_0(tmp_path):
    endpoints = dict(endpoint=f"ipc://{tmp_path}/pub", replay_endpoint=f"ipc://{tmp_path}/rep")
    worker = MockVllmWorker(**endpoints)
    a, x = tokens(1, 1), tokens(9, 2)
    async with following(worker) as (sub, sink):
        await started(sub, worker)
        worker.publish([stored([b"a"], None, a)])
        worker.publish([])
        await until(lambda: sub.next_seq == 2, what="seq 1")
        worker.close()
        worker = MockVllmWorker(**endpoints)
        assert await asyncio.to_thread(worker.wait_subscribed)
        worker.publish([stored([b"x0", b"x1"], None, x)])
        await until(lambda: sub.stats.num_restarts == 1 and sub.next_seq == 1,
                    what="the restart")
        assert sink.contents() == {"device": set(router_hashes(x)), "host": set()}
        assert sub.mode == EVENTS
    worker.close()


async def test_joining_a_kvroute_publisher_late_resyncs_from_its_snapshot():
    publisher = VllmEventPublisher(VllmPublisherConfig(buffer_steps=2, heartbeat_s=3600),
                                   MODEL, B)
    chains = [tokens(i, 2) for i in range(5)]
    for i, token_ids in enumerate(chains):
        hashes = router_hashes(token_ids)
        publisher.publish(EventBatch("engine", "e", i, (
            BlockStored(tuple(hashes), None, "device", tuple(token_ids)),)), [("", "")])
    assert publisher.flush()  # seqs 0..5; the replay buffer holds only 4 and 5
    async with following(publisher) as (sub, sink):
        await until(lambda: sub.stats.num_snapshots == 1, what="the snapshot")
        truth = {h for c in chains for h in router_hashes(c)}
        assert sink.contents() == {"device": truth, "host": set()}
        assert (sub.mode, sub.next_seq) == (EVENTS, 6)
    publisher.close()
