"""The Ray Serve request router of the engine deployment: `router.core.router.Router` inside Serve.

Serve creates one instance per deployment handle in each process that calls the engine (each
gateway replica). `choose_replicas` reads the request's first argument, which carries the
prompt's token ids and Protocol 1 block hashes (`EngineRequest`, `PinRequest`), so the
gateway hashes once and nothing is re-tokenized here; it returns every candidate as its own
rank, in the policy's order, so Serve sends the request to the policy's choice and, when
that replica is full (max_ongoing_requests), to the next one rather than backing off and
retrying. The decision is recorded on the first; `on_request_routed` moves it (marks, load)
when Serve sent the request further down. The instance keeps its index mirror fresh from
the KV index actor (`IndexMirror`), falls back to approximate mode when the actor is
unreachable or stale, feeds finished requests back to the load tracker, and exports the
router series.

Serve calls these hooks on its router event loop; the mirror runs there too, and a lock
guards the `Router` against completion callbacks from other threads.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ray import serve
from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from router.cluster.hit_bound import HitBoundLink
from router.cluster.metrics_hub import MetricsHubConfig, MetricsPusher
from router.cluster.route_ends import split_reports
from router.core.hit_curve import HitCurveConfig
from router.core.router import Router, RouterConfig
from router.serve.index_mirror import IndexMirror, MirrorConfig
from router.serve.router_metrics import RouterMetrics

log = logging.getLogger(__name__)

_SWEEP_AT_DECISIONS = 1024  # undispatched decisions kept before looking for abandoned ones
_ABANDONED_AFTER_S = 60.0
# A direct route its replica has not claimed this long after its decision never reached it
# (HAProxy's client left before it was sent, HAProxy sent it elsewhere: its config lagged,
# or its router call timed out; or nobody sent it: a call to /internal/route without a
# request): released. A replica claims a route with its next publish (50 ms), so this is
# many times the usual delay.
_DIRECT_CLAIM_WINDOW_S = 5.0
# A direct route still open this long after its decision, on a replica whose latest stats
# show nothing running or waiting, has ended and its end was lost: released.
_DIRECT_IDLE_GRACE_S = 5.0
_DIRECT_LOST_AFTER_S = 600.0  # a direct route whose end never came back (longer than any
# request runs here): its load is released


def _max_tokens(call: Any) -> int:
    """Decode tokens the call asks for: `EngineRequest.sampling` or `RouteCall.max_tokens`."""
    sampling = getattr(call, "sampling", None)
    if sampling is not None:
        return sampling.max_tokens
    return getattr(call, "max_tokens", 0)


def gateway_process_id() -> str:
    """The Serve replica tag of this gateway process, else `pid-N` (a driver, a test)."""
    try:
        return serve.get_replica_context().replica_tag
    except Exception:  # not inside a Serve replica
        return f"pid-{os.getpid()}"


class KVRouteRequestRouter(RequestRouter):
    """Routes engine calls with kvroute's policies (cache_aware, round_robin, ...)."""

    def initialize_state(self, model: str = "", router: dict | None = None,
                         mirror: dict | None = None, metrics: dict | None = None,
                         bound: dict | None = None) -> None:
        self.gateway_id = gateway_process_id()
        self._lock = threading.RLock()
        self.router = Router(RouterConfig(**(router or {})))
        self.mirror = IndexMirror(self.router, self.gateway_id, self._lock,
                                  config=MirrorConfig(**(mirror or {})),
                                  on_routes_ended=self.routes_finished,
                                  on_poll=self._reconcile)
        self.metrics = RouterMetrics(model, self.gateway_id, self.router.policy.name)
        self._pusher = MetricsPusher(f"router/{self.gateway_id}", self.metrics.registry,
                                     MetricsHubConfig(**(metrics or {})),
                                     before_push=self._refresh_gauges)
        # the online pooled bound: routed prompts sampled here, replayed by one actor
        self._bound = HitBoundLink(self.gateway_id, self.router.config.block_size,
                                   HitCurveConfig(**(bound or {})))
        # internal request id -> (decision, prompt tokens, decision seconds, decided at)
        self._decisions: dict[str, tuple[Any, int, float, float]] = {}
        self._routed: dict[str, str] = {}  # internal request id or route id -> replica id
        self._direct_at: dict[str, float] = {}  # direct route id -> routed at (monotonic s)
        self._unclaimed: dict[str, float] = {}  # the direct routes no replica claimed yet
        self._next_sweep_s = time.monotonic() + _ABANDONED_AFTER_S
        self._started = False

    # ---- Serve hooks ----

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        self._start()
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        call = pending_request.args[0] if pending_request and pending_request.args else None
        target = getattr(call, "target_replica_id", None)
        if target in by_id:
            return [[by_id[target]]]
        token_ids = getattr(call, "prompt_token_ids", None)
        if pending_request is None or token_ids is None:
            return [candidate_replicas]  # not a prompt (an admin call): Serve's least queue
        await self.mirror.wait_first_poll()
        # A direct-streaming route (router/serve/ingress_router.py) goes out over HTTP, not
        # through Serve: it is routed now, and its end comes back from the engine replica
        # through the index actor (`routes_finished`).
        route_id = getattr(call, "route_id", None)
        request_id = route_id or pending_request.metadata.internal_request_id
        block_hashes = getattr(call, "block_hashes", None) or []
        start_s = time.perf_counter()
        with self._lock:
            reason = self.mirror.check_stale()
            decision = self.router.route(request_id, block_hashes, len(token_ids),
                                         list(by_id), _max_tokens(call))
        elapsed_s = time.perf_counter() - start_s
        self.mirror.share_marks(decision.replica_id, block_hashes)  # for the other routers
        if reason is not None and not self.router.config.approximate:
            self.metrics.observe_fallback(reason)
        if route_id is not None:
            self.metrics.observe_decision(decision, len(token_ids), elapsed_s)
            self._routed[route_id] = decision.replica_id
            self._direct_at[route_id] = self._unclaimed[route_id] = time.monotonic()
            self._update_outstanding(decision.replica_id)
        else:
            self._decisions[request_id] = (decision, len(token_ids), elapsed_s,
                                           time.monotonic())
        # Sweep when many are kept, and at least once a period: a quiet router must not keep
        # an abandoned decision's load for ever either.
        if (len(self._decisions) + len(self._direct_at) > _SWEEP_AT_DECISIONS
                or time.monotonic() >= self._next_sweep_s):
            self._sweep_abandoned()
        self._bound.sampler.on_routed(getattr(call, "block_hashes", None) or [], len(token_ids))
        # A direct route is sent where HAProxy is told, which is the replica Serve picked:
        # usually the first; if Serve spilled it, its load stays counted on the first until
        # its end comes back (this hook does not run for it).
        return [[by_id[replica_id]] for replica_id in decision.ranked_ids]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        request_id = pending_request.metadata.internal_request_id
        entry = self._decisions.pop(request_id, None)
        self._routed[request_id] = replica_id.unique_id  # its completion ends it either way
        if entry is None:
            return
        decision, num_prompt_tokens, elapsed_s, _ = entry
        if decision.replica_id != replica_id.unique_id:  # spilled down the ranking
            with self._lock:
                decision = self.router.move(request_id, replica_id.unique_id) or decision
            call = pending_request.args[0] if pending_request.args else None
            self.mirror.share_marks(decision.replica_id,
                                    getattr(call, "block_hashes", None) or [])
        self.metrics.observe_decision(decision, num_prompt_tokens, elapsed_s)
        self._update_outstanding(replica_id.unique_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """The request ended, or an attempt at it did (a replica rejected it, the caller
        gave up): either way its outstanding load and held marks go now. Popping only the
        decision (as before) could take a retry's decision and leave its load for ever."""
        self._decisions.pop(internal_request_id, None)
        self._routed.pop(internal_request_id, None)
        with self._lock:
            self.router.on_finished(internal_request_id)
        self._update_outstanding(replica_id.unique_id)

    def routes_finished(self, reported: Sequence[str]) -> None:
        """Direct-streaming requests that reached (claims) or ended on their replica, as the
        index actor relays them (router/cluster/route_ends.py)."""
        reports = split_reports(reported)
        for route_id in reports.claimed:
            self._unclaimed.pop(route_id, None)
        self._release_routes(reports.ended, cached_tokens=reports.cached_tokens)
        self._release_routes(reports.refused, ran=False)

    def _release_routes(self, route_ids: Sequence[str], ran: bool = True,
                        cached_tokens: Mapping[str, int] | None = None) -> None:
        """Ends the routes' records; `ran=False`: they did no work where they were routed
        (never got there, or refused), so their recent work goes too. `cached_tokens`: what
        their engines served from cache, for the miss causes."""
        for route_id in route_ids:
            self._direct_at.pop(route_id, None)
            self._unclaimed.pop(route_id, None)
            replica_id = self._routed.pop(route_id, None)
            if replica_id is None:
                continue
            causes = None
            with self._lock:
                if ran:
                    causes = self.router.on_finished(
                        route_id, cached_tokens.get(route_id) if cached_tokens else None)
                else:
                    self.router.withdraw(route_id)
            if causes is not None:
                self.metrics.observe_misses(causes)
            self._update_outstanding(replica_id)

    def _reconcile(self, reply: Any) -> None:
        """After each index poll (at least one a second): releases the direct routes no
        replica claimed in time and those the replicas' own stats say are not there
        (above), and sweeps abandoned decisions when due, also on an idle router. Only on a
        poll that came back: claims and ends travel that way, so while the index actor is
        unreachable nothing is released for want of them."""
        # the fleet's device KV capacity, for the pooled bound's capacity multiples
        self._bound.capacity_blocks = sum(s.num_blocks for s in reply.stats.values()) or None
        now = time.monotonic()
        if self._unclaimed:
            cutoff = now - _DIRECT_CLAIM_WINDOW_S
            unclaimed = [r for r, t in self._unclaimed.items() if t < cutoff]
            if unclaimed:
                self._release_routes(unclaimed, ran=False)
        if self._direct_at:
            idle = {rid for rid, stats in reply.stats.items()
                    if stats.num_running + stats.num_waiting == 0}
            cutoff = now - _DIRECT_IDLE_GRACE_S
            gone = [r for r, t in self._direct_at.items()
                    if t < cutoff and self._routed.get(r) in idle]
            if gone:
                self._release_routes(gone)
        if now >= self._next_sweep_s:
            self._sweep_abandoned()

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        old_ids = {rid.unique_id for rid in self._replica_id_set}
        super().update_replicas(replicas)
        new_ids = {rid.unique_id for rid in self._replica_id_set}
        for replica_id in new_ids - old_ids:
            self.metrics.add_replica(replica_id)
        for replica_id in old_ids - new_ids:
            self._drop_replica(replica_id, dead=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._drop_replica(replica_id.unique_id, dead=True)

    # ---- internals ----

    def _start(self) -> None:
        """The mirror's polls and the series' pushes start with the first decision: a
        process whose handle never routes (Serve's fallback proxy in front of the engine
        replicas with ingress direct, an engine replica's handle to its own deployment)
        costs the index actor and its own CPU nothing."""
        if not self._started:  # on Serve's router loop
            self._started = True
            self.mirror.start()
            self._pusher.start()
            self._bound.start()

    def _sweep_abandoned(self) -> None:
        """Decisions never dispatched (the caller gave up while Serve was routing) get no
        completion callback, and a direct route's end can be lost (the index actor
        restarted): release their load after a while."""
        now = time.monotonic()
        self._next_sweep_s = now + _ABANDONED_AFTER_S / 2
        cutoff = now - _ABANDONED_AFTER_S
        for request_id in [r for r, e in self._decisions.items() if e[3] < cutoff]:
            del self._decisions[request_id]
            with self._lock:
                self.router.on_finished(request_id)
        cutoff = now - _DIRECT_LOST_AFTER_S
        self._release_routes([r for r, t in self._direct_at.items() if t < cutoff])

    def _drop_replica(self, replica_id: str, dead: bool) -> None:
        self.mirror.forget_replica(replica_id)
        self.metrics.remove_replica(replica_id)
        for request_id in [r for r, rep in self._routed.items() if rep == replica_id]:
            del self._routed[request_id]
            self._direct_at.pop(request_id, None)
            self._unclaimed.pop(request_id, None)
        if dead:  # tell the index now rather than after the replica's lease runs out
            self._event_loop.create_task(self.mirror.report_dead(replica_id))

    def _update_outstanding(self, replica_id: str) -> None:
        with self._lock:
            n = self.router.loads.num_outstanding(replica_id)
        self.metrics.set_outstanding(replica_id, n)

    def _refresh_gauges(self) -> None:
        self.metrics.drop_expired()
        with self._lock:
            blocks = self.router.index_blocks()
            loads = {r.unique_id: self.router.loads.load(r.unique_id)
                     for r in self._replica_id_set}
        self.metrics.set_index_blocks(blocks)
        for replica_id, tokens in loads.items():
            self.metrics.set_load_tokens(replica_id, tokens)
