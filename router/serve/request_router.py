"""The Ray Serve request router of the engine deployment: `router.core.router.Router` inside Serve.

Serve creates one instance per deployment handle in each process that calls the engine (each
gateway replica). `choose_replicas` reads the request's first argument, which carries the
prompt's token ids and Protocol 1 block hashes (`EngineRequest`, `PinRequest`), so the
gateway hashes once and nothing is re-tokenized here; it returns every candidate as its own
rank, in the policy's order, so Serve sends the request to the policy's choice and, when
that replica is full (max_ongoing_requests), to the next one rather than backing off and
retrying. The decision is recorded on the first, in the core's ledger
(router/core/ledger.py), which owns it until it is released; `on_request_routed` moves it
(marks, load) when Serve sent the request further down. This class only turns Serve's hooks
and the index actor's reports into ledger calls: a Serve call (`RouteKind.CALL`) ends with
Serve's completion callback, a direct route (a `RouteCall`, `RouteKind.DIRECT`) with its
replica's report, and the ledger's own timeouts release the ones whose end never comes.
The instance keeps its index mirror fresh from the KV index actor (`IndexMirror`), falls
back to approximate mode when the actor is unreachable or stale, and exports the router
series. Through the mirror it shares each decision (its pending marks and the work it
charged) and each end with the other routers (router/cluster/mark_sharing.py), whose load
then counts it as their own.

Serve calls these hooks on its router event loop; the mirror runs there too, and a lock
guards the `Router` against completion callbacks from other threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Histogram
from ray import serve
from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from router.cluster.hit_bound import HitBoundLink
from router.cluster.index_mirror import IndexMirror, MirrorConfig
from router.cluster.metrics_hub import MetricsHubConfig, MetricsPusher
from router.cluster.route_ends import split_reports
from router.cluster.shared_marks import RoutedWork
from router.core.candidates import list_offset, rotated, router_offset
from router.core.hit_curve import HitCurveConfig
from router.core.ledger import LedgerConfig, Release, RouteKind
from router.core.process_policy import prepare_router_process
from router.core.router import Router, RouterConfig
from router.front.router_metrics import RouterMetrics
from router.serve.route_calls import RouteCall

log = logging.getLogger(__name__)

# From a direct request's end on its replica to its release here: the time this router's
# load holds a request that has ended.
# Request ids whose miss causes were counted, kept to count a retried request once (far more
# than are ever in flight between an attempt and its retry).
MISSES_COUNTED_IDS = 65_536
END_DELAY_BUCKETS_S = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04,
                       0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _max_tokens(call: Any) -> int:
    """Decode tokens the call asks for: `RouteCall.max_tokens`, `EngineRequest.sampling`'s
    (a `PinRequest` asks for none)."""
    if isinstance(call, RouteCall):
        return call.max_tokens
    sampling = getattr(call, "sampling", None)
    return 0 if sampling is None else sampling.max_tokens


def gateway_process_id() -> str:
    """The Serve replica tag of this gateway process, else `pid-N` (a driver, a test)."""
    try:
        return serve.get_replica_context().replica_tag
    except Exception:  # not inside a Serve replica
        return f"pid-{os.getpid()}"


class ServeRequestRouter(RequestRouter):
    """Routes engine calls with kvroute's policies (cache_aware, round_robin, ...)."""

    def initialize_state(self, model: str = "", router: dict | None = None,
                         mirror: dict | None = None, metrics: dict | None = None,
                         bound: dict | None = None, ledger: dict | None = None,
                         clock: Callable[[], float] = time.monotonic,
                         gateway_id: str | None = None) -> None:
        """Serve passes the deployment's `request_router_kwargs`; `clock` (monotonic
        seconds: the ledger's timeouts) and `gateway_id` (else this process's) are for
        tests. (A test cannot patch this module's functions instead: Serve pickles this
        class by value, and a handle in the same process unpickles it over the original,
        its methods then reading a copy of the module's globals.)"""
        self.gateway_id = gateway_id or gateway_process_id()
        # where this router's list of replicas starts until it knows its rank among the
        # routers (then `list_offset`): ties spread across routers
        self.candidate_offset = router_offset(self.gateway_id)
        self._lock = threading.RLock()
        self.router = Router(RouterConfig(**(router or {})), clock,
                             LedgerConfig(**(ledger or {})))
        self.mirror = IndexMirror(self.router, self.gateway_id, self._lock,
                                  config=MirrorConfig(**(mirror or {})),
                                  on_routes_ended=self.routes_finished,
                                  on_poll=self._reconcile)
        self.metrics = RouterMetrics(model, self.gateway_id, self.router.policy.name)
        self._end_delay = Histogram(
            "kvroute_router_end_delay_seconds",
            "From a direct request's end on its replica (its clock) to its release here",
            ("gateway",), buckets=END_DELAY_BUCKETS_S,
            registry=self.metrics.registry).labels(self.gateway_id)
        self._pusher = MetricsPusher(f"router/{self.gateway_id}", self.metrics.registry,
                                     MetricsHubConfig(**(metrics or {})),
                                     before_push=self._refresh_gauges)
        # the online pooled bound: routed prompts sampled here, replayed by one actor
        self._bound = HitBoundLink(self.gateway_id, self.router.config.block_size,
                                   HitCurveConfig(**(bound or {})))
        self._started = False
        self._pushing = False
        self._misses_counted: OrderedDict[str, None] = OrderedDict()  # the newest ids
        # Ray's, Serve's and this router's start-up objects leave the collector's
        # generations (a full collection inside a decision would walk all ~140k of them),
        # and the mirror's polls (Serve's router thread) and the requests (the replica's)
        # hand each other the GIL sooner: router/core/process_policy.py
        prepare_router_process()

    # ---- Serve hooks ----

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        self._start_pushes()
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        call = pending_request.args[0] if pending_request and pending_request.args else None
        target = getattr(call, "target_replica_id", None)
        if target in by_id:
            return [[by_id[target]]]
        # Only a prompt or an argument-less call (a routing process's warm-up: the ingress
        # router's `choose_replica()`, the gateway's `replica_info`, so that its first
        # client's prompt does not wait for the mirror's first poll) starts the mirror:
        # Serve's own proxy serves the GETs (readiness probes, /v1/models) through a handle
        # like this one, each call with its request, and a router started there would take
        # every replica's events and every shared mark without routing anything
        if pending_request is not None and not pending_request.args:
            self._start_routing()
        token_ids = getattr(call, "prompt_token_ids", None)
        if pending_request is None or token_ids is None:
            return [candidate_replicas]  # not a prompt (an admin call): Serve's least queue
        self._start_routing()
        await self.mirror.wait_first_poll()
        # A direct-streaming route (router/serve/ingress_endpoint.py) goes out over HTTP, not
        # through Serve: it is routed now, and its arrival and end come back from the engine
        # replica through the index actor (`routes_finished`).
        if isinstance(call, RouteCall):
            kind, request_id = RouteKind.DIRECT, call.route_id
        else:
            kind, request_id = RouteKind.CALL, pending_request.metadata.internal_request_id
        block_hashes = getattr(call, "block_hashes", None) or []
        with self._lock:
            reason = self.mirror.check_stale()
            offset = list_offset(len(by_id), self.candidate_offset, self.mirror.router_rank)
            decision = self.router.route(request_id, block_hashes, len(token_ids),
                                         rotated(by_id, offset),
                                         _max_tokens(call), kind,
                                         getattr(call, "num_sequences", 1))
            record = self.router.ledger.get(request_id)
            work = self._work_of(request_id)
            # Due every so often and when many are kept, so a quiet router too releases
            # a decision whose end never comes; free otherwise.
            expired = self.router.expire()
        # for the other routers
        self.mirror.share_marks(decision.replica_id, block_hashes, work)
        self._share_expired(expired)
        if reason is not None and not self.router.config.approximate:
            self.metrics.observe_fallback(reason)
        if kind is RouteKind.DIRECT:  # no dispatch hook comes for it
            self.metrics.observe_routed(record)
            self._update_outstanding([decision.replica_id])
        else:
            # Serve fires no hook for a call whose caller gives up while it is being routed
            # (no completion without a replica): its pending request's future, cancelled,
            # is the only word of it. One callback per request, however often it is chosen.
            on_cancel = _WithdrawIfCancelled(self, request_id)
            pending_request.future.remove_done_callback(on_cancel)
            pending_request.future.add_done_callback(on_cancel)
        self._update_outstanding(e.replica_id for e in expired)
        self._bound.sampler.on_routed(block_hashes, len(token_ids))
        # A direct route is sent where HAProxy is told, which is the replica Serve picked:
        # usually the first; if Serve spilled it, its load stays counted on the first until
        # its end comes back (this hook does not run for it).
        return [[by_id[replica_id]] for replica_id in decision.ranked_ids]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        """Serve dispatched the call to `replica_id` (with strict max_ongoing_requests
        only): its record moves there if Serve spilled it down the ranking."""
        request_id = pending_request.metadata.internal_request_id
        with self._lock:
            before = self.router.ledger.get(request_id)
            record = self.router.dispatched(request_id, replica_id.unique_id)
            work = self._work_of(request_id)
        if record is None:  # ended already (its completion came first), or a retry's
            return
        if before.replica_id != record.replica_id:  # spilled down the ranking
            call = pending_request.args[0] if pending_request.args else None
            self.mirror.share_end(request_id, before.replica_id, withdrawn=True)  # moved
            self.mirror.share_marks(record.replica_id,
                                    getattr(call, "block_hashes", None) or [], work)
        self.metrics.observe_routed(record)
        self._update_outstanding([record.replica_id])

    def abandoned(self, request_id: str) -> None:
        """The caller gave up on the call before Serve dispatched it: withdrawn now, not at
        the ledger's abandoned timeout."""
        with self._lock:
            replica_id = self.router.abandon(request_id)
        if replica_id is not None:
            self.mirror.share_end(request_id, replica_id, withdrawn=True)
            self._update_outstanding([replica_id])

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """The request ended, or an attempt at it did (a replica rejected it, the caller
        gave up): either way its outstanding load and held marks go now (a retry routed
        under the same id since loses its record too, rather than keep its load for ever).
        Serve says nothing of what its engine found cached: the miss causes the decision
        knew are counted (a pin, which asks no output, is no request's miss)."""
        with self._lock:
            record = self.router.ledger.get(internal_request_id)
            # a request's misses count once: a retry after a rejected attempt is routed
            # again under the same id
            count = (record is not None and record.max_tokens > 0
                     and internal_request_id not in self._misses_counted)
            if count:
                self._misses_counted[internal_request_id] = None
                if len(self._misses_counted) > MISSES_COUNTED_IDS:
                    self._misses_counted.popitem(last=False)
            causes = self.router.on_finished(internal_request_id, count_misses=count)
        if causes is not None:
            self.metrics.observe_misses(causes)
        if record is not None:  # where the other routers count it
            self.mirror.share_end(internal_request_id, record.replica_id)
        self._update_outstanding([replica_id.unique_id])

    def routes_finished(self, reported: Sequence[str]) -> None:
        """Direct-streaming requests that reached (claims) or ended on their replica, as the
        index actor relays them (router/cluster/route_ends.py). An end releases what the
        route charged (`refused`: it ran nothing, so its recent work goes too); the cached
        tokens an end carries feed the miss causes, its output tokens the decode charge.
        An end for a route released already (its replica died, a timeout) changes nothing.
        The other routers had the ends from the actor as this router's work ends."""
        reports = split_reports(reported)
        now_s = time.time()  # the replicas' clock for the ends' times (same host or NTP)
        touched: set[str] = set()
        delays_s: list[float] = []
        with self._lock:
            ledger = self.router.ledger
            for route_id in reports.claimed:
                self.router.claim(route_id)
            for route_id in reports.ended:
                record = ledger.get(route_id)
                if record is None or record.kind is not RouteKind.DIRECT:
                    continue
                causes = self.router.on_finished(route_id,
                                                 reports.cached_tokens.get(route_id),
                                                 reports.output_tokens.get(route_id))
                if causes is not None:
                    self.metrics.observe_misses(causes)
                touched.add(record.replica_id)
                ended_at_s = reports.ended_at_s.get(route_id)
                if ended_at_s is not None:
                    delays_s.append(max(0.0, now_s - ended_at_s))
            for route_id in reports.refused:
                record = ledger.get(route_id)
                if record is None or record.kind is not RouteKind.DIRECT:
                    continue
                self.router.withdraw(route_id)
                touched.add(record.replica_id)
        self.mirror.ended_by_relay((*reports.ended, *reports.refused))
        for delay_s in delays_s:
            self._end_delay.observe(delay_s)
        self._update_outstanding(touched)

    def _reconcile(self, reply: Any) -> None:
        """After each index poll (at least one a second) the ledger releases the direct
        routes no replica claimed in time and those on a replica whose own stats say it is
        idle, and sweeps the long timeouts when due. Only on a poll that came back: claims
        and ends travel that way, so while the index actor is unreachable nothing is
        released for want of them."""
        # the fleet's device KV capacity, for the pooled bound's capacity multiples
        self._bound.capacity_blocks = sum(s.num_blocks for s in reply.stats.values()) or None
        idle = frozenset(rid for rid, stats in reply.stats.items()
                         if stats.num_running + stats.num_waiting == 0)
        with self._lock:
            expired = self.router.expire(idle)
        if expired:
            self._share_expired(expired)
            self._update_outstanding(e.replica_id for e in expired)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        old_ids = {rid.unique_id for rid in self._replica_id_set}
        super().update_replicas(replicas)
        new_ids = {rid.unique_id for rid in self._replica_id_set}
        for replica_id in new_ids - old_ids:
            self.metrics.add_replica(replica_id)
            self.mirror.revive(replica_id)  # listed again: its events count again
        for replica_id in old_ids - new_ids:
            self._drop_replica(replica_id, dead=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._drop_replica(replica_id.unique_id, dead=True)

    # ---- internals ----

    def _start_pushes(self) -> None:
        """The series' pushes start with the first call of any kind, so they are there, at
        zero, before the first prompt counts: a counter whose first sample is not zero
        makes Prometheus's rate() extrapolate each series by its own value, and the hit
        rate's numerator and denominator by different factors. A process whose handle is
        never called (an engine replica's handle to its own deployment) pushes nothing."""
        if not self._pushing:  # on Serve's router loop
            self._pushing = True
            self._pusher.start()

    def _start_routing(self) -> None:
        """The mirror's polls and the bound's samples start with the first prompt to route
        or an argument-less warm-up call: a process whose handle never routes one (Serve's
        fallback proxy in front of the engine replicas with ingress direct, which still
        serves the GETs, each call with the request as its argument) costs the index actor
        and its own CPU nothing."""
        if not self._started:  # on Serve's router loop
            self._started = True
            self.mirror.start()
            self._bound.start()

    def _drop_replica(self, replica_id: str, dead: bool) -> None:
        self.mirror.forget_replica(replica_id)  # its records leave the ledger with it
        self.metrics.remove_replica(replica_id)
        if dead:  # tell the index now rather than after the replica's lease runs out
            self._event_loop.create_task(self.mirror.report_dead(replica_id))

    def _work_of(self, request_id: str) -> RoutedWork | None:
        """What the request charged its replica's load, for the other routers (None: it is
        not outstanding). Under the lock."""
        charge = self.router.loads.charge(request_id)
        return None if charge is None else RoutedWork(request_id, *charge)

    def _share_expired(self, expired: Iterable[Any]) -> None:
        """The ledger released these for want of their end: the other routers drop them."""
        for request_id, replica_id, release in expired:
            self.mirror.share_end(request_id, replica_id, withdrawn=release is not Release.END)

    def _update_outstanding(self, replica_ids: Iterable[str]) -> None:
        """The outstanding gauge counts this router's own requests, not the routes other
        routers shared (which its load counts too)."""
        replica_ids = set(replica_ids)
        if not replica_ids:
            return
        with self._lock:
            remote = self.mirror.remote
            counts = {r: self.router.loads.num_outstanding(r) - remote.num_on(r)
                      for r in replica_ids}
        for replica_id, n in counts.items():
            self.metrics.set_outstanding(replica_id, n)

    def _refresh_gauges(self) -> None:
        self.metrics.drop_expired()
        with self._lock:
            blocks = self.router.index_blocks()
            loads = {r.unique_id: self.router.loads.load(r.unique_id)
                     for r in self._replica_id_set}
            published = {r: self.router.loads.published(r) for r in loads}
        self.metrics.set_index_blocks(blocks)
        self.metrics.set_shared_decisions(self.mirror.marks.num_shared_decisions,
                                          self.mirror.num_shared_received)
        for replica_id, tokens in loads.items():
            self.metrics.set_load_tokens(replica_id, tokens)
            if (stats := published[replica_id]) is not None:
                self.metrics.set_published_requests(replica_id, stats[1], stats[2])


@dataclass(frozen=True)
class _WithdrawIfCancelled:
    """Done callback of a Serve call's pending request (equal by router and id, so a
    request chosen again replaces its callback rather than add one)."""

    router: ServeRequestRouter
    request_id: str

    def __call__(self, future: asyncio.Future) -> None:
        if future.cancelled():
            self.router.abandoned(self.request_id)
