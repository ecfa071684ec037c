"""The external workers whose vLLM-format KV events the KV index actor follows.

One `VllmEventSubscriber` task per worker feeds the index's ReplicaLog for that worker (the
worker id is its replica id). Workers are added and removed at runtime; removing one
cancels its subscriber and drops its index. A batch for a worker not in the set (from a
subscriber being removed) is ignored and counted. Each worker's mode (events |
approximate) is readable by routers (`modes()`, also in every index poll reply) and, with
the subscribers' counters, exported as metrics (`collect()`: docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kv.events import EventBatch, Snapshot
from router.cluster.vllm_subscriber import VllmEventSubscriber
from router.cluster.vllm_subscriber_spec import (
    APPROXIMATE,
    EVENTS,
    SubscriberConfig,
    SubscriberSpec,
    SubscriberStats,
)

log = logging.getLogger(__name__)


class IndexSink(Protocol):
    """The KV index's side: what the subscribers feed, and how a worker is dropped."""

    def publish(self, batch: EventBatch) -> bool: ...
    def publish_snapshot(self, snap: Snapshot) -> None: ...
    def forget_replica(self, replica_id: str) -> bool: ...


@dataclass(frozen=True)
class ExternalWorkerStatus:
    mode: str  # "events" | "approximate"
    spec: SubscriberSpec
    stats: SubscriberStats
    num_unmapped_blocks: int


class _WorkerSink:
    """One subscriber's way into the index, closed when its worker leaves the set."""

    def __init__(self, workers: ExternalWorkers, worker_id: str):
        self._workers, self._worker_id = workers, worker_id

    def _known(self, replica_id: str) -> bool:
        followed = self._workers.followed(self._worker_id)
        known = replica_id == self._worker_id and followed is not None and followed.sink is self
        if not known:
            self._workers.num_unknown_worker_batches += 1
        return known

    def publish(self, batch: EventBatch) -> bool:
        return self._workers.index.publish(batch) if self._known(batch.replica_id) else False

    def publish_snapshot(self, snap: Snapshot) -> None:
        if self._known(snap.replica_id):
            self._workers.index.publish_snapshot(snap)


@dataclass
class _Followed:
    subscriber: VllmEventSubscriber
    sink: _WorkerSink
    task: asyncio.Task


class ExternalWorkers:
    def __init__(self, index: IndexSink, config: SubscriberConfig | None = None):
        self.index = index
        self.config = config or SubscriberConfig()
        self.num_unknown_worker_batches = 0
        self._workers: dict[str, _Followed] = {}

    def followed(self, worker_id: str) -> _Followed | None:
        return self._workers.get(worker_id)

    def ids(self) -> set[str]:
        return set(self._workers)

    async def add(self, spec: SubscriberSpec) -> None:
        """Starts following `spec.worker_id` (again, from scratch, if it was followed)."""
        await self.remove(spec.worker_id)
        sink = _WorkerSink(self, spec.worker_id)
        subscriber = VllmEventSubscriber(spec, sink, self.config)
        task = asyncio.get_running_loop().create_task(self._follow(subscriber))
        self._workers[spec.worker_id] = _Followed(subscriber, sink, task)

    async def remove(self, worker_id: str) -> bool:
        """Stops following a worker and drops its index; False when it was not followed."""
        followed = self._workers.pop(worker_id, None)
        if followed is None:
            return False
        followed.task.cancel()
        await asyncio.gather(followed.task, return_exceptions=True)
        self.index.forget_replica(worker_id)
        return True

    async def close(self) -> None:
        for worker_id in list(self._workers):
            await self.remove(worker_id)

    def modes(self) -> dict[str, str]:
        return {wid: f.subscriber.mode for wid, f in self._workers.items()}

    def status(self) -> dict[str, ExternalWorkerStatus]:
        return {wid: ExternalWorkerStatus(f.subscriber.mode, f.subscriber.spec,
                                          f.subscriber.stats,
                                          f.subscriber.map.stats.num_unmapped_blocks)
                for wid, f in self._workers.items()}

    async def _follow(self, subscriber: VllmEventSubscriber) -> None:
        worker_id = subscriber.spec.worker_id
        while True:  # a subscriber that fails (a socket error) starts over, never stops
            try:
                await subscriber.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the KV event subscriber of %s failed; restarting", worker_id)
                await asyncio.sleep(self.config.replay_timeout_s)

    def collect(self):
        """Prometheus families (register this object in a CollectorRegistry)."""
        mode = GaugeMetricFamily("kvroute_external_worker_mode",
                                 "1 for the KV event mode an external worker is in",
                                 labels=("replica", "mode"))
        counters = {
            name: CounterMetricFamily(f"kvroute_external_worker_kv_{name}", doc,
                                      labels=labels)
            for name, doc, labels in (
                ("batches", "vLLM KV event batches applied in order", ("replica",)),
                ("malformed", "payloads or frames that did not decode (dropped)",
                 ("replica",)),
                ("unknown_events", "events of unknown types (skipped)", ("replica",)),
                ("unmapped_blocks", "stored blocks whose hashes could not be mapped",
                 ("replica",)),
                ("gaps", "sequence gaps, by outcome: replayed or lost", ("replica", "outcome")),
                ("resyncs", "views rebuilt: a publisher snapshot or a worker restart",
                 ("replica", "reason")),
                ("refused", "batches refused, by reason: oversized, over_budget (a replay or "
                 "snapshot), flood (the worker was cut off), cut_off (dropped undecoded)",
                 ("replica", "reason")))}
        for wid, status in self.status().items():
            for m in (EVENTS, APPROXIMATE):
                mode.add_metric([wid, m], 1.0 if status.mode == m else 0.0)
            s = status.stats
            counters["batches"].add_metric([wid], s.num_batches)
            counters["malformed"].add_metric([wid], s.num_malformed)
            counters["unknown_events"].add_metric([wid], s.num_unknown_events)
            counters["unmapped_blocks"].add_metric([wid], status.num_unmapped_blocks)
            counters["gaps"].add_metric([wid, "replayed"], s.num_gaps_replayed)
            counters["gaps"].add_metric([wid, "lost"], s.num_gaps_lost)
            counters["resyncs"].add_metric([wid, "snapshot"], s.num_snapshots)
            counters["resyncs"].add_metric([wid, "restart"], s.num_restarts)
            for reason, value in (("oversized", s.num_oversized),
                                  ("over_budget", s.num_over_budget),
                                  ("flood", s.num_floods),
                                  ("cut_off", s.num_dropped_cut_off)):
                counters["refused"].add_metric([wid, reason], value)
        unknown = CounterMetricFamily("kvroute_external_worker_kv_unknown_worker_batches",
                                      "mapped batches for a worker not in the set (ignored)")
        unknown.add_metric([], self.num_unknown_worker_batches)
        return [mode, *counters.values(), unknown]
