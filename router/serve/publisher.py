"""A replica's publisher: its KV events and load stats to the KV index actor (Protocol 2).

Every `publish_interval_s` it drains the engine's event log and sends the batch with the
engine's stats (an empty batch is the heartbeat that keeps the replica known). When the
actor answers that it saw a gap or a new epoch (or does not know the replica: it restarted),
it sends a snapshot, with the prefixes the engine holds pinned. A failed send loses
that batch on purpose: the actor sees the gap and asks for a snapshot, so nothing needs a
retry buffer here. With direct streaming each publish also carries the routes that ended
here since the last one (router/cluster/route_ends.py); a lost publish loses them too, and
the routers release that load after a long timeout instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import ray

from kv.events import EventBatch, Snapshot
from router.cluster.actor_link import ActorLink
from worker.api import EngineStats, PinnedPrefix

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublisherConfig:
    publish_interval_s: float = 0.05

    def __post_init__(self):
        if not self.publish_interval_s > 0:
            raise ValueError(f"publish_interval_s must be > 0, got {self.publish_interval_s}")


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

    def start(self) -> None:
        interval_s = self._config.publish_interval_s
        self._index.start(self._publish, interval_s, retry_interval_s=interval_s)

    async def publish_once(self) -> None:
        await self._index.call(self._publish)

    async def stop(self, replica_id: str) -> None:
        """Stops publishing and tells the actor to forget this replica."""
        self._index.stop()
        index = self._index.found_handle
        try:
            if index is not None:
                await index.forget_replica.remote(replica_id)
        except ray.exceptions.RayError as err:
            log.warning("goodbye to the index actor failed: %s", err)

    async def _publish(self, index: Any) -> None:
        batch = self._engine.drain_events()
        stats = self._engine.stats()
        ended = self._take_route_ends() if self._take_route_ends is not None else None
        if await index.publish.remote(batch, stats, ended or None):
            await index.publish_snapshot.remote(self._engine.snapshot(), stats,
                                                self._engine.pinned_prefixes())
            self.num_snapshots_sent += 1
