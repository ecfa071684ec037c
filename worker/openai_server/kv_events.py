"""The server's KV events: drained from the engine on a timer and handed to a sink.

The engine appends Protocol 2 events (kv/events.py) to its log as its cache changes; the
log keeps them until drained. The pump drains it every `interval_s` whether or not anyone
listens (an undrained log would grow until it drops its oldest events) and gives each
non-empty batch to the sink, e.g. a ZMQ publisher in vLLM's wire format.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kv.events import EventBatch

log = logging.getLogger(__name__)


class KVEventSink(Protocol):
    """Where a standalone engine's KV event batches go.

    Contract: `publish` is called on the event loop, once per non-empty batch, in sequence
    order (each batch's `first_seq` is the previous batch's `next_seq` unless the engine's
    log overflowed); it must not block for long (queue or send without waiting) and may
    raise: the pump logs the error and carries on, and the lost batch is a gap that the
    consumer recovers from. `close` is called once, after the last `publish`.
    """

    def publish(self, batch: EventBatch) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EventPumpConfig:
    interval_s: float = 0.01  # how stale the router's view may be, at worst, from this end

    def __post_init__(self):
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")


class EventPump:
    """Drains `drain()` into `sink` (or nowhere) every `config.interval_s`."""

    def __init__(self, drain: Callable[[], EventBatch], sink: KVEventSink | None,
                 config: EventPumpConfig | None = None):
        self._drain = drain
        self._sink = sink
        self._config = config or EventPumpConfig()
        self._task: asyncio.Task | None = None
        self.num_batches_published = 0
        self.num_publish_errors = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def pump_once(self) -> None:
        batch = self._drain()
        if self._sink is None or not batch.events:
            return
        try:
            self._sink.publish(batch)
            self.num_batches_published += 1
        except Exception:  # a lost batch is a gap the consumer recovers from; keep serving
            self.num_publish_errors += 1
            log.exception("publishing KV events %d..%d failed", batch.first_seq,
                          batch.next_seq - 1)

    async def stop(self) -> None:
        """Stops the timer, publishes what is left, and closes the sink."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self.pump_once()
        if self._sink is not None:
            self._sink.close()

    async def _run(self) -> None:
        while True:
            self.pump_once()
            await asyncio.sleep(self._config.interval_s)
