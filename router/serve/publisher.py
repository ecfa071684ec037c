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
retry buffer here.

With direct streaming the replica also reports the routes it serves
(router/serve/route_tracking.py): an end goes to the index actor soon (a router's load
holds an ended request for that round trip, not for up to a publish interval more): with a
publish when one is due (a publish interval since the last: the blocks the request stored
reach the routers with its end, in one call), else in a `report_routes` call of its own,
which wakes only the routers that routed those requests (an early publish would wake
every router with the replica's events, up to 1 / `min_report_gap_s` times a second
instead of 1 / `publish_interval_s`). Claims, which only need to arrive within the routers'
claim window, go with an end or with the next publish. One call that carries reports is in
flight at a time, and one starts no sooner than `min_report_gap_s` after the last: a lone
end on a quiet replica leaves at once, a busy replica's ends queue meanwhile and go
together. One publish is in flight at a time (their batches keep their order). A failed
call puts its reports back for the next (the routers apply a claim or an end once however
often it comes); a failed publish loses its events, which the actor heals with a snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kv.events import EventBatch, Snapshot
from protocol.engine import EngineStats, PinnedPrefix
from router.cluster.actor_link import ActorLink

log = logging.getLogger(__name__)

_DRAIN_REPORTS_S = 5.0  # at shutdown, the last route ends' report waits at most this long


@dataclass(frozen=True)
class PublisherConfig:
    publish_interval_s: float = 0.05
    heartbeat_interval_s: float = 1.0  # an idle replica publishes this often
    # A route report starts no sooner than this after the last call that carried reports:
    # ends that come meanwhile wait for it and go together. An end waits at most this
    # long (a lone one not at all), and a busy replica makes at most 1 / this report calls
    # a second. 0: each report as soon as the one in flight returns.
    min_report_gap_s: float = 0.01

    def __post_init__(self):
        if not self.publish_interval_s > 0:
            raise ValueError(f"publish_interval_s must be > 0, got {self.publish_interval_s}")
        if not 0 <= self.min_report_gap_s <= self.publish_interval_s:
            raise ValueError(f"min_report_gap_s must be in [0, publish_interval_s], got "
                             f"{self.min_report_gap_s}")
        if not self.heartbeat_interval_s >= self.publish_interval_s:
            raise ValueError(f"heartbeat_interval_s must be >= publish_interval_s, got "
                             f"{self.heartbeat_interval_s}")


class EventSource(Protocol):
    """What the publisher needs of an engine."""

    def drain_events(self) -> EventBatch: ...
    def snapshot(self) -> Snapshot: ...
    def stats(self) -> EngineStats: ...
    def pinned_prefixes(self) -> tuple[PinnedPrefix, ...]: ...


class RouteReportSource(Protocol):
    """The claims and ends of the routes a replica serves (router/serve/route_tracking.py)."""

    def take(self) -> dict[str, tuple[str, ...]]: ...
    def pending(self) -> bool: ...
    def put_back(self, reports: dict[str, tuple[str, ...]]) -> None: ...
    def on_end(self, listener: Callable[[], None] | None) -> None: ...


class ReplicaPublisher:
    """Publishes one engine's events to the index actor that `get_index()` returns (called
    again after a failure: a dead actor is re-created under its name). The actor has the
    remote methods `publish`, `publish_snapshot`, `report_routes` and `forget_replica`."""

    def __init__(self, engine: EventSource, get_index: Callable[[], Any],
                 config: PublisherConfig | None = None,
                 route_reports: RouteReportSource | None = None, replica_id: str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        """`replica_id`: this replica's, sent with its route reports (publishes carry it in
        their batch). `clock` times the publishes and the gap between reports, `sleep` waits
        the gap (tests fake both)."""
        self._engine = engine
        self._replica_id = replica_id
        self._index = ActorLink("publishing KV events", get_index)
        # the direct-streaming requests claimed and ended here, by router id
        self._route_reports = route_reports
        self._config = config or PublisherConfig()
        self._loop: asyncio.AbstractEventLoop | None = None  # the one the reports go from
        # the report task that runs: ends queued meanwhile go with it
        self._report_task: asyncio.Task | None = None
        self._report_failing = False  # the last report failed (logged once)
        # one publish at a time: a batch drained later must not reach the actor first
        self._publish_lock = asyncio.Lock()
        self._clock, self._sleep = clock, sleep
        # the next report starts no sooner than this (`clock()` seconds)
        self._next_report_s = float("-inf")
        self.num_snapshots_sent = 0
        self.num_publishes_sent = 0
        self.num_reports_sent = 0
        self._last_stats: EngineStats | None = None  # as last sent
        self._last_sent_s = float("-inf")  # `clock()` of the last publish
        self._stopping = False  # said goodbye: reports no longer publish (nor revive it)

    def start(self) -> None:
        interval_s = self._config.publish_interval_s
        self._index.start(self._publish, interval_s, retry_interval_s=interval_s)
        if self._route_reports is not None:
            self._loop = asyncio.get_running_loop()
            self._route_reports.on_end(self._report_soon)

    async def publish_once(self) -> None:
        """Publishes now, news or not."""
        await self._index.call(lambda index: self._publish(index, force=True))

    async def stop(self, replica_id: str) -> None:
        """Stops publishing (the ends reported last sent first) and tells the actor to
        forget this replica."""
        self._index.stop()
        self._stopping = True
        if self._route_reports is not None:
            self._route_reports.on_end(None)
            try:  # bounded: a goodbye must not wait on an actor that does not answer
                await asyncio.wait_for(self.drain_reports(), _DRAIN_REPORTS_S)
            except asyncio.TimeoutError:
                log.warning("the last route ends were not reported in time")
        index = self._index.found_handle
        try:
            if index is not None:
                await index.forget_replica.remote(replica_id)
        except Exception as err:  # through Ray or its fast calls: a RayError, a timeout,
            # a lost connection
            log.warning("goodbye to the index actor failed: %r", err)

    async def _publish(self, index: Any, force: bool = False) -> None:
        """Sends what is news (everything when `force`): the events drained, the stats, the
        route reports queued."""
        async with self._publish_lock:
            batch = self._engine.drain_events()  # an empty drain takes no sequence number
            stats = self._engine.stats()
            ended = self._route_reports.take() if self._route_reports is not None else None
            now_s = self._clock()
            if (not force and not batch.events and not ended and stats == self._last_stats
                    and now_s - self._last_sent_s < self._config.heartbeat_interval_s):
                return
            if ended:  # it carries reports: the next report keeps the gap from it too
                self._next_report_s = now_s + self._config.min_report_gap_s
            try:
                needs_snapshot = await index.publish.remote(batch, stats, ended or None)
            except BaseException:
                if ended:  # the routers apply a report once however often it comes
                    self._route_reports.put_back(ended)
                raise
            self._last_stats, self._last_sent_s = stats, now_s
            self.num_publishes_sent += 1
            if needs_snapshot:
                await index.publish_snapshot.remote(self._engine.snapshot(), stats,
                                                    self._engine.pinned_prefixes())
                self.num_snapshots_sent += 1

    def _report_soon(self) -> None:
        """A request ended (on any thread): its report leaves on the publisher's loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:
            self._start_report()
        else:
            loop.call_soon_threadsafe(self._start_report)

    async def drain_reports(self) -> None:
        """Returns once the claims and ends queued so far were sent (or failed to be)."""
        while self._report_task is not None:
            await asyncio.shield(self._report_task)

    def _start_report(self) -> None:
        if self._report_task is None:
            self._report_task = self._loop.create_task(self._report())

    async def _report(self) -> None:
        """Sends the queued claims and ends, then again, a gap after the last call, while
        more queued meanwhile."""
        try:
            while True:
                wait_s = self._next_report_s - self._clock()
                if wait_s > 0:  # the gap: ends that come meanwhile go together after it
                    await self._sleep(wait_s)
                if not self._route_reports.pending():
                    return
                try:
                    await self._index.call(self._send_reports)
                except Exception as err:  # the actor is away: they go with the next
                    # publish (a retry interval from now), not in a loop here
                    if not self._report_failing:  # once an outage, not once a request
                        log.warning("reporting route ends to the index actor failed: %r", err)
                    self._report_failing = True
                    return
                self._report_failing = False
                self.num_reports_sent += 1
        finally:
            self._report_task = None

    async def _send_reports(self, index: Any) -> None:
        """The queued reports: with a publish if one is due, else alone."""
        due_s = self._last_sent_s + self._config.publish_interval_s
        if not self._stopping and self._clock() >= due_s:
            await self._publish(index)
            return
        reports = self._route_reports.take()
        if not reports:
            return
        self._next_report_s = self._clock() + self._config.min_report_gap_s
        try:
            await index.report_routes.remote(reports, self._replica_id)
        except BaseException:
            self._route_reports.put_back(reports)
            raise
