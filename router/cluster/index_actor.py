"""The KV index actor: the cluster's one view of what every replica caches (Protocol 2).

Replicas push their event batches and load stats (`publish`); a gap or a new epoch answers
"send a snapshot" and the replica does (`publish_snapshot`). Routers long-poll (`poll`) with
a cursor per replica and get deltas, or a snapshot where their cursor is unknown, too old,
too new or of another epoch (a new or restarted router, a restarted actor). A replica that
stops publishing for `replica_timeout_s`, says goodbye, or is reported dead is forgotten,
and every router is told.

External workers (vLLM, SGLang, `kvroute engine`) do not push: the actor follows their
vLLM-format KV events over ZMQ (router/cluster/external_workers.py), added and removed at
runtime; they never time out, and each one's mode (events | approximate) comes with every
poll reply. A restarted actor has forgotten them: whoever added them adds them again when
`get_incarnation()` changes.

With direct streaming, replicas also report the claims and ends of requests a router
routed, as they end (with a publish when one is due, else `report_routes`, which wakes only
those routers' long polls, each at most once every `min_end_wake_gap_s` for ends alone),
and each router's poll takes its own (router/cluster/route_ends.py); every other router gets
the ends as work ends in the routing router's name, as if it had shared them
(router/cluster/shared_marks.py), so that router need not send them back through here.

The routers that polled in the last `router_timeout_s` are the live routers; each reply
tells its router its rank among them, sorted by id, from which it lists the replicas
(router/core/candidates.py).

The actor also keeps the named pinned prefixes (router/cluster/prefix_registry.py; rebuilt
from the replicas' own pins after a restart) and the index digests routers report, so tests
and operators can check that views converge.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Any

import ray

from kv.events import ContentsDigest, EventBatch, Snapshot
from protocol.engine import EngineStats, PinnedPrefix
from router.cluster.actors import get_or_create_actor
from router.cluster.external_workers import ExternalWorkers
from router.cluster.fast_call_server import FastCallServer
from router.cluster.fast_calls import FAST_METHODS, FastAddress, reach_fast_calls
from router.cluster.index_actor_calls import ExternalWorkerCalls, PrefixCalls
from router.cluster.metrics_hub import MetricsPusher
from router.cluster.packed_batches import PackedBatches, join, split
from router.cluster.poll_messages import PollReply, PollRequest, positions_of, values_of
from router.cluster.prefix_registry import PrefixRecord, PrefixRegistry, record_of_pin
from router.cluster.replica_log import ReplicaLog
from router.cluster.route_ends import RouteEnds, work_ends_of
from router.cluster.shared_marks import Shared, SharedMarks, SharedMarksConfig
from router.cluster.vllm_subscriber_spec import SubscriberConfig
from router.core.candidates import rank_among

INDEX_ACTOR_NAME = "kvroute-index"
_ENDS_ONLY = object()  # a long poll woken for route ends alone (not other news)


@dataclass(frozen=True)
class IndexActorConfig:
    replica_timeout_s: float = 10.0  # forget a replica silent this long
    max_logged_events: int = 8192  # per replica, for router deltas
    max_poll_wait_s: float = 1.0
    # a router silent this long leaves `router_views` and the routers ranked
    router_timeout_s: float = 10.0
    # A router's long poll returns with route ends alone (no other news) no sooner than
    # this after its last reply with some: a router is woken for ends at most 1 / this
    # times a second, however many replicas report them. An end waits at most this long
    # here (one on a quiet router not at all). 0: each report wakes its routers.
    min_end_wake_gap_s: float = 0.01

    def __post_init__(self):
        if not self.min_end_wake_gap_s >= 0:
            raise ValueError(f"min_end_wake_gap_s must be >= 0, got {self.min_end_wake_gap_s}")
        if not self.replica_timeout_s > 0:
            raise ValueError(f"replica_timeout_s must be > 0, got {self.replica_timeout_s}")
        if self.max_logged_events < 1:
            raise ValueError(f"max_logged_events must be >= 1, got {self.max_logged_events}")
        if not self.max_poll_wait_s >= 0:
            raise ValueError(f"max_poll_wait_s must be >= 0, got {self.max_poll_wait_s}")


@dataclass
class _Replica:
    log: ReplicaLog
    last_seen_s: float
    stats: EngineStats | None = None


class KVIndex(PrefixCalls, ExternalWorkerCalls):
    """The actor's state and methods (plain class, also usable without Ray in tests)."""

    def __init__(self, config: IndexActorConfig | None = None):
        self._config = config or IndexActorConfig()
        self.incarnation = uuid.uuid4().hex  # new after every (re)start of the actor
        self._replicas: dict[str, _Replica] = {}
        # Each synced replica's (epoch, next_seq), kept as its log changes: a poll finds the
        # replicas its cursors lag behind as a set difference of these items (in C), not by
        # visiting every replica (O(replicas) Python a poll, 8 routers' polls a core at 800).
        self._positions: dict[str, tuple[str, int]] = {}
        # Every replica's latest stats, and them as `values_of` makes them (made once a
        # publish, not once a reply), in the same order: a reply copies both.
        self._stats: dict[str, EngineStats] = {}
        self._stats_values: dict[str, tuple] = {}
        self._router_views: dict[str, tuple[float, dict[str, ContentsDigest]]] = {}
        self._router_ids: tuple[str, ...] = ()  # the live routers, sorted (their ranks)
        self.route_ends = RouteEnds(self._config.router_timeout_s,
                                    min_take_gap_s=self._config.min_end_wake_gap_s)
        self.shared_marks = SharedMarks(
            SharedMarksConfig(router_timeout_s=self._config.router_timeout_s))
        self.prefixes = PrefixRegistry()
        self._waiters: dict[asyncio.Future, str] = {}  # long polls waiting: router id
        # the followed external workers (their metrics collector; tests read it too)
        self.external_workers = ExternalWorkers(self, SubscriberConfig())
        self._external_metrics: MetricsPusher | None = None
        self._fast: FastCallServer | None = None  # the per-request calls over ZMQ

    async def fast_calls(self) -> FastAddress:
        """Where this actor serves its per-request calls over ZMQ (fast_calls.py)."""
        if self._fast is None:
            host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
            self._fast = FastCallServer(self, FAST_METHODS, host)
        return self._fast.address()

    # ---- replicas ----

    def publish(self, batch: EventBatch, stats: EngineStats | None = None,
                ended_routes: dict[str, tuple[str, ...]] | None = None) -> bool:
        """Applies a replica's batch (and queues the route ids that ended there, by router
        id); True asks the replica for `publish_snapshot`."""
        rep = self._touch(batch.replica_id)
        news = bool(batch.events) or (stats is not None and stats != rep.stats)
        if stats is not None:
            self._set_stats(batch.replica_id, rep, stats)
        needs_snapshot = rep.log.publish(batch)
        self._note_position(batch.replica_id, rep)
        if ended_routes:
            self._add_route_reports(ended_routes, batch.replica_id, wake=not news)
        if news:  # a bare heartbeat wakes no router's long poll
            self._notify()
        return needs_snapshot

    def report_routes(self, reports: dict[str, tuple[str, ...]],
                      replica_id: str | None = None) -> None:
        """Claims and ends of direct routes a replica reports without a publish (by router
        id, as `publish` carries them)."""
        self._add_route_reports(reports, replica_id, wake=True)

    def _add_route_reports(self, reports: dict[str, tuple[str, ...]],
                           replica_id: str | None, wake: bool) -> None:
        """Queues each router's reports for it, and relays their ends to the other routers
        as its work ends (their load counts its routes' work). `wake`: wakes the long polls
        that got news, the routers' own reports as ends alone (which keep their gap)."""
        relayed_from = set()
        if replica_id is not None:  # an end names its replica
            for router_id, route_ids in reports.items():
                if self.shared_marks.add(router_id, work_ends_of(replica_id, route_ids)):
                    relayed_from.add(router_id)
        routers = self.route_ends.add(reports)
        if not wake:
            return
        if len(relayed_from) > 1:  # every router has another's ends
            self._notify()
            return
        if relayed_from:
            self._notify(skip_router_id=next(iter(relayed_from)))
        if routers:
            self._notify(only_router_ids=frozenset(routers), news=_ENDS_ONLY)

    def publish_packed(self, packed: PackedBatches, stats: dict[str, EngineStats]
                       ) -> tuple[str, ...]:
        """Many replicas' batches in one call (a relay in front of a node's replicas: a
        call costs the actor about a millisecond whatever it carries), with their latest
        stats. Returns the replicas that must `publish_snapshot`."""
        packed.validate()
        news = False
        needs_snapshot = []
        for batch, columns in zip(packed.unpack(), split(packed)):
            rep = self._touch(batch.replica_id)
            stat = stats.get(batch.replica_id)
            news = news or bool(batch.events) or (stat is not None and stat != rep.stats)
            if stat is not None:
                self._set_stats(batch.replica_id, rep, stat)
            if rep.log.publish(batch, columns):
                needs_snapshot.append(batch.replica_id)
            self._note_position(batch.replica_id, rep)
        if news:
            self._notify()
        return tuple(needs_snapshot)

    def publish_snapshot(self, snap: Snapshot, stats: EngineStats | None = None,
                         pinned: tuple[PinnedPrefix, ...] = ()) -> None:
        """Applies a replica's snapshot. `pinned`: the prefixes it holds pinned; from a
        replica this actor did not know (it restarted, or the replica is new) they rebuild
        the prefix records this actor lacks."""
        known = self._replicas.get(snap.replica_id)
        if known is None or not known.log.synced:  # its first snapshot to this actor
            for pin in pinned:
                record = record_of_pin(pin, snap.replica_id)
                if record is not None:
                    self.prefixes.adopt(record)
        rep = self._touch(snap.replica_id)
        if stats is not None:
            self._set_stats(snap.replica_id, rep, stats)
        rep.log.apply_snapshot(snap)
        self._note_position(snap.replica_id, rep)
        self._notify()

    def forget_replica(self, replica_id: str) -> bool:
        """Drops a replica (goodbye, or reported dead); True when it was known."""
        known = self._replicas.pop(replica_id, None) is not None
        self._positions.pop(replica_id, None)
        self._stats.pop(replica_id, None)
        self._stats_values.pop(replica_id, None)
        self.prefixes.orphan_replica(replica_id)
        if known:
            self._notify()
        return known

    def get_incarnation(self) -> str:
        return self.incarnation

    def replica_ids(self) -> list[str]:
        self._expire()
        return sorted(self._replicas)

    def replica_digests(self) -> dict[str, ContentsDigest]:
        self._expire()
        return {rid: rep.log.digest() for rid, rep in self._replicas.items() if rep.log.synced}

    # ---- routers ----

    def share_marks(self, router_id: str, marks: tuple[Shared, ...]) -> None:
        """A router's new pending marks, routed work and work ends, for the other routers'
        next poll (woken now)."""
        if self.shared_marks.add(router_id, marks):
            self._notify(skip_router_id=router_id)

    async def poll(self, request: PollRequest) -> PollReply:
        """Answers at once with news; else waits for some, up to `request.wait_s`. Route
        ends alone are news once their router's gap since its last ends has passed
        (`min_end_wake_gap_s`): until then they wait, and go with any other news."""
        router_id = request.router_id
        now_s = time.monotonic()
        self._register_router(router_id, now_s, dict(request.view))
        until_s = now_s + min(request.wait_s, self._config.max_poll_wait_s)
        woken = False  # by news other than route ends (changed stats count)
        while True:
            reply = self._delta(request)
            ends_due_s = self.route_ends.due_s(router_id)
            if (woken or reply.snapshots or reply.batches or reply.packed
                    or reply.removed_replica_ids or reply.shared_marks or now_s >= until_s
                    or (ends_due_s is not None and ends_due_s <= now_s)):
                return dataclasses.replace(reply,
                                           ended_route_ids=self.route_ends.take(router_id),
                                           router_rank=rank_among(router_id, self._router_ids))
            news = asyncio.get_running_loop().create_future()
            self._waiters[news] = router_id
            wake_s = until_s if ends_due_s is None else min(until_s, ends_due_s)
            try:  # until news, the ends' gap or the poll's end, whichever is first
                woken = await asyncio.wait_for(news, wake_s - now_s) is not _ENDS_ONLY
            except asyncio.TimeoutError:
                pass
            finally:
                self._waiters.pop(news, None)
            now_s = time.monotonic()

    def router_views(self) -> dict[str, dict[str, ContentsDigest]]:
        """The index digests of the routers that polled in the last `router_timeout_s`."""
        self._expire_routers(time.monotonic())
        return {rid: view for rid, (_, view) in self._router_views.items()}

    def _register_router(self, router_id: str, now_s: float,
                         view: dict[str, ContentsDigest]) -> None:
        """A router polled: it counts among the live routers, whose ranks each reply
        carries. When that set changes the other routers' waiting polls return now, so
        they list the replicas from their new ranks at once."""
        self._expire_routers(now_s)
        if router_id not in self._router_views:  # new, or back after it expired
            self.shared_marks.forget(router_id)
        self._router_views[router_id] = (now_s, view)
        router_ids = tuple(sorted(self._router_views))
        if router_ids != self._router_ids:
            self._router_ids = router_ids
            self._notify(skip_router_id=router_id)

    def _expire_routers(self, now_s: float) -> None:
        cutoff = now_s - self._config.router_timeout_s
        for router_id in [r for r, (t, _) in self._router_views.items() if t < cutoff]:
            del self._router_views[router_id]

    # ---- pinned prefixes (the other calls: router/cluster/index_actor_calls.py) ----

    def list_prefixes(self, tenant: str) -> list[PrefixRecord]:
        self._expire()
        return self.prefixes.of_tenant(tenant)

    def check_invariants(self) -> None:
        for rep in self._replicas.values():
            rep.log.check_invariants()
        assert self._positions == {rid: (rep.log.epoch, rep.log.next_seq)
                                   for rid, rep in self._replicas.items() if rep.log.synced}
        assert self._stats == {rid: rep.stats for rid, rep in self._replicas.items()
                               if rep.stats is not None}
        assert list(self._stats_values) == list(self._stats)
        assert all(values_of(self._stats[r]) == v for r, v in self._stats_values.items())
        self.shared_marks.check_invariants()

    # ---- internals ----

    def _delta(self, request: PollRequest) -> PollReply:
        self._expire()
        snapshots: list[Snapshot] = []
        batches: list = []  # EventBatch, or PackedBatches of one batch when packed
        positions = positions_of(request.cursors)
        # the synced replicas whose position the router lacks, in the replicas' order
        behind = {rid for rid, _ in self._positions.items() - positions.items()}
        for replica_id in (self._positions if len(behind) == len(self._positions)
                           else [r for r in self._positions if r in behind]):
            rep = self._replicas[replica_id]
            cursor = request.cursors.get(replica_id)
            delta = (rep.log.packed_delta_since(cursor) if request.packed
                     else rep.log.delta_since(cursor))
            if delta is None:
                snap = rep.log.snapshot()
                if snap is not None:
                    snapshots.append(snap)
            else:
                batches.extend(delta)
        removed = tuple(sorted(positions.keys() - self._replicas.keys()))
        packed = join(batches) if request.packed else None
        return PollReply(tuple(snapshots), () if request.packed else tuple(batches),
                         dict(self._stats), removed, self.external_workers.modes(), (),
                         self.incarnation, self.shared_marks.take(request.router_id), packed,
                         stats_values=tuple(self._stats_values.values()))

    def _set_stats(self, replica_id: str, rep: _Replica, stats: EngineStats) -> None:
        rep.stats = self._stats[replica_id] = stats
        self._stats_values[replica_id] = values_of(stats)

    def _note_position(self, replica_id: str, rep: _Replica) -> None:
        """Keeps `_positions` as the replica's log now stands (after it changed)."""
        log = rep.log
        if log.synced:
            self._positions[replica_id] = (log.epoch, log.next_seq)
        else:
            self._positions.pop(replica_id, None)

    def _touch(self, replica_id: str) -> _Replica:
        rep = self._replicas.get(replica_id)
        now = time.monotonic()
        if rep is None:
            rep = _Replica(ReplicaLog(replica_id, self._config.max_logged_events), now)
            self._replicas[replica_id] = rep
        rep.last_seen_s = now
        return rep

    def _expire(self) -> None:
        cutoff = time.monotonic() - self._config.replica_timeout_s
        external = self.external_workers.ids()  # followed, not pushing: they never time out
        for replica_id in [r for r, rep in self._replicas.items()
                           if rep.last_seen_s < cutoff and r not in external]:
            self.forget_replica(replica_id)

    def _notify(self, skip_router_id: str | None = None,
                only_router_ids: frozenset[str] | None = None, news: object = None) -> None:
        """Wakes the waiting long polls (of `only_router_ids`, but `skip_router_id`'s);
        `news=_ENDS_ONLY`: all they get is route ends, which keep their gap."""
        for waiter in [f for f, r in self._waiters.items() if r != skip_router_id
                       and (only_router_ids is None or r in only_router_ids)]:
            if not waiter.done():
                waiter.set_result(news)
            del self._waiters[waiter]


IndexActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0,
                        max_concurrency=1000)(KVIndex)


def get_index_actor(config: IndexActorConfig | None = None) -> ray.actor.ActorHandle:
    """The cluster's `kvroute-index` actor, created by the first process that asks."""
    return get_or_create_actor(IndexActor, INDEX_ACTOR_NAME, config or IndexActorConfig())


def find_index() -> Any:
    """The index actor's handle (a `FastHandle`: its per-request calls over ZMQ when they
    answer there, else Ray's; fast_calls.py). Blocking: call it from a thread."""
    return reach_fast_calls(get_index_actor())
