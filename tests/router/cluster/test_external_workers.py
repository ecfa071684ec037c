"""The KV index follows external workers' vLLM events: added and removed at runtime, their
mode in every poll reply and in the metrics, events of unknown workers ignored."""

import asyncio

import pytest
import ray
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kv.events import EventBatch, Snapshot
from router.cluster.index_actor import KVIndex, PollRequest, get_index_actor
from router.cluster.metrics_hub import get_metrics_hub
from router.cluster.vllm_subscriber_spec import SubscriberSpec
from router.core.engine_hash_map import EngineHashConfig
from tests.router.cluster.mock_vllm_worker import MockVllmWorker
from tests.router.cluster.test_vllm_subscriber import (
    MODEL,
    B,
    removed,
    router_hashes,
    stored,
    tokens,
    until,
)


def spec(worker_id, worker) -> SubscriberSpec:
    return SubscriberSpec(worker_id, worker.endpoint, EngineHashConfig(MODEL, B),
                              worker.replay_endpoint)


def device_contents(reply, worker_id):
    return {s.replica_id: set(s.device_hashes) for s in reply.snapshots}.get(worker_id)


def samples(text: bytes) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text.decode()) for s in fam.samples}


async def test_workers_join_and_leave_at_runtime_and_unknown_workers_are_ignored():
    index = KVIndex()
    workers = index.external_workers
    w1, w2 = MockVllmWorker(), MockVllmWorker()
    a, b = tokens(1, 2), tokens(2, 1)
    await index.add_external_worker(spec("w1", w1))
    await index.add_external_worker(spec("w2", w2))
    assert await asyncio.to_thread(w1.wait_subscribed)
    assert await asyncio.to_thread(w2.wait_subscribed)
    w1.publish([stored([b"a0", b"a1"], None, a)])
    w2.publish([stored([b"b0"], None, b)])
    await until(lambda: {r: d.num_device_blocks for r, d in index.replica_digests().items()}
                == {"w1": 2, "w2": 1}, what="both workers' blocks")
    reply = await index.poll(PollRequest("router", {}))
    assert device_contents(reply, "w1") == set(router_hashes(a))
    assert device_contents(reply, "w2") == set(router_hashes(b))
    assert reply.worker_modes == index.external_worker_modes() == {"w1": "events",
                                                                   "w2": "events"}

    stale_sink = workers.followed("w2").sink
    assert await index.remove_external_worker("w2")
    assert not await index.remove_external_worker("w2")
    # A batch from w2's subscriber after w2 left, and one naming another worker: ignored.
    assert not stale_sink.publish(EventBatch("w2", "e", 0, ()))
    stale_sink.publish_snapshot(Snapshot("w9", "e", 0, frozenset()))
    assert workers.num_unknown_worker_batches == 2
    assert index.replica_ids() == ["w1"]
    w1.publish([removed([b"a1"])])
    await until(lambda: index.replica_digests()["w1"].num_device_blocks == 1,
                what="the removal")
    registry = CollectorRegistry()
    registry.register(workers)
    values = samples(generate_latest(registry))
    assert values[("kvroute_external_worker_mode", (("mode", "events"), ("replica", "w1")))] == 1
    assert values[("kvroute_external_worker_kv_batches_total", (("replica", "w1"),))] == 2
    assert values[("kvroute_external_worker_kv_unknown_worker_batches_total", ())] == 2
    await workers.close()
    for w in (w1, w2):
        w.close()


@pytest.mark.slow
def test_the_index_actor_follows_a_worker_and_exports_its_mode():
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=128 * 1024**2,
             log_to_driver=False, namespace="external-workers-test")
    worker = MockVllmWorker(buffer_steps=2)
    try:
        index = get_index_actor()
        ray.get(index.add_external_worker.remote(spec("w", worker)))
        assert worker.wait_subscribed(60)
        a, c = tokens(1, 1), tokens(3, 1)
        worker.publish([stored([b"a"], None, a)])
        worker.publish([stored([b"x"], None, tokens(2, 1))], drop=True)
        worker.publish([removed([b"x"])], drop=True)
        worker.publish([stored([b"c"], None, c)], drop=True)  # the buffer keeps 3 and 4
        worker.publish([stored([b"d"], None, tokens(4, 1))])

        def view():
            reply = ray.get(index.poll.remote(PollRequest("router", {})))
            return device_contents(reply, "w"), reply.worker_modes

        asyncio.run(until(lambda: view() == (set(router_hashes(tokens(4, 1))),
                                             {"w": "approximate"}), 60, "the lost gap"))
        hub = get_metrics_hub()
        key = ("kvroute_external_worker_kv_gaps_total", (("outcome", "lost"), ("replica", "w")))
        asyncio.run(until(lambda: samples(ray.get(hub.exposition.remote())).get(key) == 1, 60,
                          "the metrics"))
        mode = samples(ray.get(hub.exposition.remote()))
        assert mode[("kvroute_external_worker_mode",
                     (("mode", "approximate"), ("replica", "w")))] == 1
        assert ray.get(index.remove_external_worker.remote("w"))
        reply = ray.get(index.poll.remote(PollRequest("router", {})))
        assert (reply.snapshots, reply.worker_modes) == ((), {})
    finally:
        worker.close()
        ray.shutdown()
