"""A gateway's router over external workers: the Router core, fed from the cluster.

Per gateway process: a `Router` (router/core), its index mirror fed by the KV index actor
(where workers' KV events land, filed under the worker id), and the worker set (the named
actor of router/cluster/external_worker_set.py) long-polled for the routable workers and their
scraped queue gauges. Each worker is routed on its events while the index actor says its
mode is `events` (it follows the worker's KV events and its view is exact), and on this
router's routed history otherwise (no events, or they stopped or lost a gap), one worker at
a time (`Router.set_replica_approximate`). The gateway proxies each request and releases it
itself (`release`): its record lives in the core's ledger (router/core/ledger.py) as a
`RouteKind.PROXIED` route, which no timeout releases.

For the loss ladder (docs/metrics.md, "Where the hits go"), each routed prompt is sampled
for the pooled bound (`HitBoundLink`, as the Serve routers do), with the fleet's capacity
the sum of the up workers' `vllm:cache_config_info` (unknown while one lacks it: then only
the bound at infinite capacity is exported). Each release counts the miss causes: all four
when the worker's answer says its cached tokens, else the three the decision knew.

Everything runs on the gateway's event loop; the lock guards the Router against the index
mirror, which shares it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import ray

from kv.hashing import BlockHash
from router.cluster.external_worker_spec import WorkerSetView, WorkerSpec, WorkerStatus
from router.cluster.hit_bound import HitBoundLink
from router.cluster.index_mirror import IndexMirror, MirrorConfig
from router.cluster.metrics_hub import MetricsHubConfig, MetricsPusher
from router.core.hit_curve import HitCurveConfig
from router.core.ledger import RouteKind
from router.core.process_policy import prepare_router_process
from router.core.router import Router, RouterConfig, RoutingDecision
from router.front.router_metrics import RouterMetrics
from router.gateway.external_metrics import WorkerModeMetrics
from router.gateway.output_tokens import AnswerUsage

log = logging.getLogger(__name__)

WORKER_POLL_WAIT_S = 1.0  # long-poll of the worker set
WORKER_POLL_RETRY_S = 0.5  # after a failed poll


class NoWorkerAvailable(Exception):
    """No routable worker is left for the request (the gateway answers 503)."""


class ExternalWorkerRouter:
    """Args:
        router_config: the Router core's settings (block size = the gateway's hashing).
        model: served model name (metric label).
        gateway_id: this gateway process's id (metric label, index mirror id).
        worker_set: handle of the worker-set actor (`poll`, `report_failure`).
        bound_config: the hit-bound actor's, should this gateway create it.
    """

    def __init__(self, router_config: RouterConfig, model: str, gateway_id: str,
                 worker_set: Any, mirror_config: MirrorConfig | None = None,
                 metrics_config: MetricsHubConfig | None = None,
                 bound_config: HitCurveConfig | None = None):
        self._lock = threading.RLock()
        self.router = Router(router_config)
        self.mirror = IndexMirror(self.router, gateway_id, self._lock, config=mirror_config,
                                  on_removed=self.router.drop_index)
        self.metrics = RouterMetrics(model, gateway_id, self.router.policy.name)
        self.modes = WorkerModeMetrics(self.metrics.registry, gateway_id)
        self._pusher = MetricsPusher(f"router/{gateway_id}", self.metrics.registry,
                                     metrics_config, before_push=self._refresh_gauges)
        self._worker_set = worker_set
        # the online pooled bound: routed prompts sampled here, replayed by one actor
        self.bound = HitBoundLink(gateway_id, router_config.block_size,
                                  bound_config or HitCurveConfig())
        self.view = WorkerSetView(-1, ())  # -1: not polled yet
        self._routable: dict[str, WorkerSpec] = {}  # up, and not drained by this gateway
        self._approximate: dict[str, bool] = {}  # worker id -> its mode, as last set
        self._first_view = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Starts the loops; returns once the worker set was read (or could not be)."""
        if self._task is None:
            # the start-up heap leaves the collector's generations (a full collection inside
            # a decision would walk all of it), and a thread hands the GIL to another sooner
            prepare_router_process()
            self.mirror.start()
            self._pusher.start()
            self.bound.start()
            self._task = asyncio.get_running_loop().create_task(self._poll_workers())
        await self._first_view.wait()

    def route(self, request_id: str, block_hashes: Sequence[BlockHash], num_prompt_tokens: int,
              max_tokens: int, exclude: frozenset[str] = frozenset(), num_sequences: int = 1
              ) -> tuple[WorkerSpec, RoutingDecision]:
        """Picks a worker (not in `exclude`) and records it until `release`; `max_tokens`
        is the output of all `num_sequences` completions (n x a batch's prompts)."""
        candidates = [w for w in self._routable if w not in exclude]
        if not candidates:
            raise NoWorkerAvailable(self._why_none(exclude))
        with self._lock:
            reason = self.mirror.check_stale()
            self._refresh_modes()
            decision = self.router.route(request_id, block_hashes, num_prompt_tokens,
                                         candidates, max_tokens, RouteKind.PROXIED,
                                         num_sequences)
            record = self.router.ledger.get(request_id)
        self.mirror.share_marks(decision.replica_id, block_hashes)  # for the other gateways
        self.metrics.observe_routed(record)
        if reason is not None and not self.router.config.approximate:
            self.metrics.observe_fallback(reason)
        self._set_outstanding(decision.replica_id)
        if not exclude:  # a prompt tried on another worker was sampled once already
            self.bound.sampler.on_routed(block_hashes, num_prompt_tokens)
        return self._routable[decision.replica_id], decision

    def release(self, request_id: str, error: str | None = None, *, refused: bool = False,
                violation: bool = False, output_tokens: int | None = None,
                usage: AnswerUsage | None = None) -> None:
        """The request is done on its worker; with `error` when the worker failed it, which
        drains the worker here at once and has the worker set check it (`violation`: its
        answer broke the protocol, and the set keeps it down a while). `refused`: the worker
        answered a 4xx and ran nothing, so everything the request charged is withdrawn.
        `output_tokens`: what it produced, as its answer says (router/core/load.py);
        `usage`: its answer's counts, whose cached tokens close the miss causes when they
        are of the prompt routed (a batch's, or a worker tokenizing otherwise, are not:
        then the causes the decision knew are counted). A request that failed or broke the
        protocol ran no prompt the gateway can vouch for: its misses are not counted."""
        causes = None
        with self._lock:
            record = self.router.ledger.get(request_id)
            if record is None:  # released already, or its worker was drained
                return
            worker_id = record.replica_id
            if refused:
                self.router.withdraw(request_id)
            else:
                cached = (usage.cached_tokens if usage is not None
                          and usage.prompt_tokens == record.num_prompt_tokens else None)
                causes = self.router.on_finished(request_id, cached, output_tokens,
                                                 count_misses=error is None)
        if causes is not None:
            self.metrics.observe_misses(causes)
        self._set_outstanding(worker_id)
        if error is not None and worker_id in self._routable:
            self._drain(worker_id)
            asyncio.get_running_loop().create_task(self._report(worker_id, error, violation))

    # ---- the worker set ----

    async def _poll_workers(self) -> None:
        while ray.is_initialized():  # a driver that shut Ray down leaves this loop running
            try:
                view = await self._worker_set.poll.remote(self.view.version, WORKER_POLL_WAIT_S)
            except Exception as err:  # the actor restarting: keep the last view meanwhile
                log.warning("worker set unreachable: %r", err)
                self._first_view.set()
                await asyncio.sleep(WORKER_POLL_RETRY_S)
                continue
            if view.version != self.view.version:
                self._apply(view)
            self._first_view.set()

    def _apply(self, view: WorkerSetView) -> None:
        up = {w.spec.worker_id: w for w in view.up()}
        with self._lock:
            for worker_id in [w for w in self._routable if w not in up]:
                self._drain(worker_id)
            for worker_id, status in up.items():
                if worker_id not in self._routable:
                    log.info("routing to worker %s", worker_id)
                    self._routable[worker_id] = status.spec
                    self.metrics.add_replica(worker_id)
                if status.stats is not None:
                    self.router.update_stats(worker_id, status.stats)
        self.view = view
        self.bound.capacity_blocks = fleet_capacity_blocks(up.values(),
                                                           self.router.config.block_size)

    def _drain(self, worker_id: str) -> None:
        """No new requests to the worker, and nothing of it left in the router."""
        log.warning("not routing to worker %s any more", worker_id)
        del self._routable[worker_id]
        self._approximate.pop(worker_id, None)
        with self._lock:  # its records leave the ledger: their release finds nothing to do
            self.router.remove_replica(worker_id)
        self.metrics.remove_replica(worker_id)
        self.modes.remove(worker_id)

    async def _report(self, worker_id: str, error: str, violation: bool) -> None:
        """Has the worker set check the worker; if it passes, it is routable again here
        (the set did not change, so no poll would bring it back)."""
        try:
            await self._worker_set.report_failure.remote(worker_id, error, violation)
            self._apply(await self._worker_set.poll.remote(-1))
        except Exception as err:
            log.warning("could not report worker %s failing: %r", worker_id, err)

    def _why_none(self, exclude: frozenset[str]) -> str:
        if exclude and self._routable:
            return f"every worker tried failed ({', '.join(sorted(exclude))})"
        down = [f"{w.spec.worker_id}: {w.error}" for w in self.view.workers if w.state == "down"]
        return "no worker is up" + (f" ({'; '.join(down)})" if down else "")

    # ---- modes and gauges ----

    def _refresh_modes(self) -> None:
        """Events mode while the index actor says so (last poll), else approximate."""
        modes = self.mirror.worker_modes
        for worker_id in self._routable:
            approximate = modes.get(worker_id) != "events"
            if self._approximate.get(worker_id) != approximate:
                self._approximate[worker_id] = approximate
                self.router.set_replica_approximate(worker_id, approximate)
                self.modes.set(worker_id, approximate)

    def _set_outstanding(self, worker_id: str) -> None:
        self.metrics.set_outstanding(worker_id, self.router.loads.num_outstanding(worker_id))

    def _refresh_gauges(self) -> None:
        self.metrics.drop_expired()
        with self._lock:
            self._refresh_modes()
            blocks = self.router.index_blocks()
            loads = {w: self.router.loads.load(w) for w in self._routable}
        self.metrics.set_index_blocks(blocks)
        for worker_id, tokens in loads.items():
            self.metrics.set_load_tokens(worker_id, tokens)


def fleet_capacity_blocks(up: Iterable[WorkerStatus], block_size: int) -> int | None:
    """The up workers' device KV capacity in the router's blocks; None when a worker's is
    unknown (a sum without it would read the curve at too small a fleet) or none is up."""
    capacities = [w.kv_capacity_tokens for w in up]
    if not capacities or None in capacities:
        return None
    return sum(capacities) // block_size or None
