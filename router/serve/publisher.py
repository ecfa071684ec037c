"""A replica's publisher: its KV events and load stats to the KV index actor (Protocol 2).

Every `publish_interval_s` it drains the engine's event log and sends the batch with the
engine's stats (an empty batch is the heartbeat that keeps the replica known). When the
actor answers that it saw a gap or a new epoch, it sends a snapshot. A failed send loses
that batch on purpose: the actor sees the gap and asks for a snapshot, so nothing needs a
retry buffer here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import ray

from kv.events import EventBatch, Snapshot
from worker.api import EngineStats

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


class ReplicaPublisher:
    """Publishes one engine's events to the index actor that `get_index()` returns (called
    again after a failure: a dead actor is re-created under its name). The actor has the
    remote methods `publish`, `publish_snapshot` and `forget_replica`."""

    def __init__(self, engine: EventSource, get_index: Callable[[], Any],
                 config: PublisherConfig | None = None):
        self._engine = engine
        self._get_index = get_index
        self._index: Any = None
        self._config = config or PublisherConfig()
        self._task: asyncio.Task | None = None
        self.num_snapshots_sent = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def publish_once(self) -> None:
        if self._index is None:
            self._index = await asyncio.to_thread(self._get_index)
        batch = self._engine.drain_events()
        stats = self._engine.stats()
        if await self._index.publish.remote(batch, stats):
            await self._index.publish_snapshot.remote(self._engine.snapshot(), stats)
            self.num_snapshots_sent += 1

    async def stop(self, replica_id: str) -> None:
        """Stops publishing and tells the actor to forget this replica."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        try:
            if self._index is not None:
                await self._index.forget_replica.remote(replica_id)
        except ray.exceptions.RayError as err:
            log.warning("goodbye to the index actor failed: %s", err)

    async def _run(self) -> None:
        while ray.is_initialized():
            try:
                await self.publish_once()
            except Exception as err:  # RayError or Ray going down: the next tick retries
                log.warning("publishing KV events failed: %r", err)
                self._index = None
            await asyncio.sleep(self._config.publish_interval_s)
