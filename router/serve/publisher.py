"""A replica's publisher: its KV events and load stats to the KV index actor (Protocol 2).

Every `publish_interval_s` it drains the engine's event log and sends the batch with the
engine's stats, when there is news: events, stats that changed, or ended routes. An idle
replica sends its empty batch only every `heartbeat_interval_s`, the heartbeat that keeps it
known (the index actor forgets a replica silent for 10 s): publishing 20 empty batches a
second per replica, each waking every router's long poll, cost an idle `kvroute serve` with
2 replicas a quarter of a core. When the
actor answers that it saw a gap or a new epoch (or does not know the replica: it restarted),
it sends a snapshot, with the prefixes the engine holds pinned. A failed send loses
that batch on purpose: the actor sees the gap and asks for a snapshot, so nothing needs a
retry buffer here. With direct streaming each publish also carries the routes that ended
here since the last one (router/cluster/route_ends.py); a lost publish loses them too, and
the routers release that load after a long timeout instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import ray

from kv.events import EventBatch, Snapshot
from protocol.engine import EngineStats, PinnedPrefix
from router.cluster.actor_link import ActorLink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublisherConfig:
    publish_interval_s: float = 0.05
    heartbeat_interval_s: float = 1.0  # an idle replica publishes this often

    def __post_init__(self):
        if not self.publish_interval_s > 0:
            raise ValueError(f"publish_interval_s must be > 0, got {self.publish_interval_s}")
        if not self.heartbeat_interval_s >= self.publish_interval_s:
            raise ValueError(f"heartbeat_interval_s must be >= publish_interval_s, got "
                             f"{self.heartbeat_interval_s}")


class EventSource(Protocol):
    """What the publisher needs of an engine."""

    def drain_events(self) -> EventBatch: ...
    def snapshot(self) -> Snapshot: ...
    def stats(self) -> EngineStats: ...
    def pinned_prefixes(self) -> tuple[PinnedPrefix, ...]: ...


class ReplicaPublisher:
    """Publishes one engine's events to the index actor that `get_index()` returns (called
    again after a failure: a dead actor is re-created under its name). The actor has the
    remote methods `publish`, `publish_snapshot` and `forget_replica`."""

    def __init__(self, engine: EventSource, get_index: Callable[[], Any],
                 config: PublisherConfig | None = None,
                 take_route_ends: Callable[[], dict[str, tuple[str, ...]]] | None = None):
        self._engine = engine
        self._index = ActorLink("publishing KV events", get_index)
        # direct-streaming requests that ended here since the last publish, by router id
        self._take_route_ends = take_route_ends
        self._config = config or PublisherConfig()
        self.num_snapshots_sent = 0
        self.num_publishes_sent = 0
        self._last_stats: EngineStats | None = None  # as last sent
        self._last_sent_s = float("-inf")  # time.monotonic() of the last send

    def start(self) -> None:
        interval_s = self._config.publish_interval_s
        self._index.start(self._publish, interval_s, retry_interval_s=interval_s)

    async def publish_once(self) -> None:
        """Publishes now, news or not."""
        await self._index.call(lambda index: self._publish(index, force=True))

    async def stop(self, replica_id: str) -> None:
        """Stops publishing and tells the actor to forget this replica."""
        self._index.stop()
        index = self._index.found_handle
        try:
            if index is not None:
                await index.forget_replica.remote(replica_id)
        except ray.exceptions.RayError as err:
            log.warning("goodbye to the index actor failed: %s", err)

    async def _publish(self, index: Any, force: bool = False) -> None:
        batch = self._engine.drain_events()  # an empty drain takes no sequence number
        stats = self._engine.stats()
        ended = self._take_route_ends() if self._take_route_ends is not None else None
        now_s = time.monotonic()
        if (not force and not batch.events and not ended and stats == self._last_stats
                and now_s - self._last_sent_s < self._config.heartbeat_interval_s):
            return
        needs_snapshot = await index.publish.remote(batch, stats, ended or None)
        self._last_stats, self._last_sent_s = stats, now_s
        self.num_publishes_sent += 1
        if needs_snapshot:
            await index.publish_snapshot.remote(self._engine.snapshot(), stats,
                                                self._engine.pinned_prefixes())
            self.num_snapshots_sent += 1
