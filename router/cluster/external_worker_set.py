"""The worker set: the external workers every gateway routes to (one named Ray actor).

It starts from the static list (`kvroute serve --workers`), takes runtime adds and removes
(the admin API, `/v1/workers`), and checks each worker's health every `health_period_s`:
a worker whose check fails is `down` (drained: gateways send it nothing new) until a check
passes again. The KV index actor follows the KV events of each worker that is up and has
an event socket (router/cluster/external_index_link.py); a worker down or removed is no
longer followed and its index is dropped (events, or routed history, rebuild it later). A
gateway that sees a worker fail reports it, and the worker is checked at once. Where a
worker exports vLLM's queue gauges, they are scraped every `load_period_s` into its stats
(the routers' load term), and its `vllm:cache_config_info` into its KV capacity (the pooled
bound's capacity multiples, router/cluster/hit_bound.py).

Gateways long-poll `poll(version)` and get the whole set whenever it changed. The set
lives in the actor only: if the actor restarts, it starts again from the static list.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, replace

import httpx
import ray

from kv.hashing import DEFAULT_BLOCK_SIZE
from router.cluster.actors import get_or_create_actor
from router.cluster.external_index_link import IndexActorLink, IndexLink
from router.cluster.external_worker_probe import (
    NO_METRICS,
    WorkerMetrics,
    check_health,
    check_worker,
    scrape_metrics,
)
from router.cluster.external_worker_spec import (
    WorkerChange,
    WorkerSetView,
    WorkerSpec,
    WorkerStatus,
)

log = logging.getLogger(__name__)

WORKER_SET_ACTOR_NAME = "kvroute-workers"


@dataclass(frozen=True)
class WorkerSetConfig:
    model: str  # the served model name every worker must list in /v1/models
    # tokens per block of the routers' hashes (their events' mapping)
    block_size: int = DEFAULT_BLOCK_SIZE
    workers: tuple[WorkerSpec, ...] = ()  # the static list
    health_period_s: float = 2.0
    health_timeout_s: float = 2.0  # per HTTP check
    load_period_s: float = 0.5  # 0: do not scrape queue gauges
    max_poll_wait_s: float = 1.0
    # A worker that broke the protocol (a redirect, a body that is not JSON or an event
    # stream, an answer over the gateway's caps, its own 5xx) stays down this long, whatever
    # its health check says: a liar passes that check.
    violation_backoff_s: float = 30.0

    def __post_init__(self):
        if not self.model:
            raise ValueError("WorkerSetConfig: model must be a non-empty name")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"WorkerSetConfig: block_size must be >= 1, got "
                             f"{self.block_size!r}")
        for name in ("health_period_s", "health_timeout_s", "violation_backoff_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"WorkerSetConfig: {name} must be > 0, got {value!r}")
        if not (math.isfinite(self.load_period_s) and self.load_period_s >= 0):
            raise ValueError(f"WorkerSetConfig: load_period_s must be >= 0, got "
                             f"{self.load_period_s!r}")
        if not self.max_poll_wait_s >= 0:
            raise ValueError("WorkerSetConfig: max_poll_wait_s must be >= 0")
        ids = [w.worker_id for w in self.workers]
        if len(set(ids)) != len(ids):
            raise ValueError("WorkerSetConfig: a worker is listed twice")


class WorkerSet:
    """The actor's state and methods (a plain class, also usable without Ray in tests).

    Args:
        config: the model, the static workers and the check periods.
        index: whom to tell which workers' KV events to follow (default: the KV index
            actor).
    """

    def __init__(self, config: WorkerSetConfig, index: IndexLink | None = None):
        self._config = config
        self._index = (index if index is not None
                       else IndexActorLink(config.model, config.block_size))
        self._workers = {w.worker_id: WorkerStatus(w, "down", "not checked yet")
                         for w in config.workers}
        self._version = 0
        self._changed = asyncio.Event()
        self._client: httpx.AsyncClient | None = None
        self._tasks: list[asyncio.Task] = []
        self._first_pass: asyncio.Future | None = None
        self._warned_load: set[str] = set()  # workers whose rejected gauges were logged
        self._down_until_s: dict[str, float] = {}  # worker id -> end of its back-off (loop)

    # ---- gateways ----

    async def poll(self, version: int, wait_s: float = 0.0) -> WorkerSetView:
        """The set, at once if it is newer than `version`, else when it changes or after
        `wait_s` (capped). The first call waits for the first health pass."""
        await self._start()
        if version == self._version and wait_s > 0:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(),
                                       min(wait_s, self._config.max_poll_wait_s))
            except asyncio.TimeoutError:
                pass
        return self.view()

    def view(self) -> WorkerSetView:
        return WorkerSetView(self._version, tuple(self._workers.values()))

    async def report_failure(self, worker_id: str, error: str, violation: bool = False
                             ) -> None:
        """A gateway could not reach the worker: check it now, drain it if it is down.
        With `violation` (its answer broke the protocol) it is down at once, for
        `violation_backoff_s`: its health check would pass."""
        status = self._workers.get(worker_id)
        if status is None or status.state == "down":
            return
        await self._start()
        if violation:
            backoff_s = self._config.violation_backoff_s
            self._down_until_s[worker_id] = asyncio.get_running_loop().time() + backoff_s
            log.warning("worker %s broke the protocol (%s): down for %.0f s", worker_id,
                        error, backoff_s)
            await self._set(worker_id, "down", f"its answer broke the protocol ({error}); "
                                               f"down for {backoff_s:.0f} s")
            return
        problem = await check_health(self._http(), status.spec, self._config.health_timeout_s)
        if problem is not None:
            log.warning("worker %s reported failing (%s): %s", worker_id, error, problem)
            await self._set(worker_id, "down", problem)

    # ---- the admin API ----

    async def add(self, spec: WorkerSpec) -> WorkerChange:
        """Adds a worker that answers its health check and serves the model."""
        await self._start()
        if spec.worker_id in self._workers:
            return self._exists(spec)
        problem = await check_worker(self._http(), spec, self._config.model,
                                     self._config.health_timeout_s)
        if problem is not None:
            return WorkerChange("unusable", None, problem)
        if spec.worker_id in self._workers:  # added by another call during the checks
            return self._exists(spec)
        self._workers[spec.worker_id] = status = WorkerStatus(spec, "up")
        self._bump()
        log.info("worker %s added", spec)
        await self._index.follow(spec)
        return WorkerChange("added", status)

    def _exists(self, spec: WorkerSpec) -> WorkerChange:
        return WorkerChange("exists", self._workers[spec.worker_id],
                            f"worker {spec.worker_id} is already in the set")

    async def remove(self, worker_id: str) -> WorkerChange:
        """Takes a worker out: no new requests go there (requests running on it finish),
        and its index is dropped."""
        status = self._workers.pop(worker_id, None)
        if status is None:
            return WorkerChange("unknown", None, f"worker {worker_id} is not in the set")
        self._bump()
        await self._index.forget(worker_id)
        log.info("worker %s removed", worker_id)
        return WorkerChange("removed", status)

    # ---- checks ----

    async def _start(self) -> None:
        if self._first_pass is None:
            loop = asyncio.get_running_loop()
            self._first_pass = loop.create_future()
            self._tasks.append(loop.create_task(
                self._repeat("health", self._health_pass, self._config.health_period_s)))
            if self._config.load_period_s > 0:
                self._tasks.append(loop.create_task(
                    self._repeat("load", self.scrape_all, self._config.load_period_s)))
        await asyncio.shield(self._first_pass)

    async def aclose(self) -> None:
        """Stops the checks (the actor's process ending stops them too)."""
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False)
        return self._client

    async def _repeat(self, what: str, one_pass, period_s: float) -> None:
        """Runs `one_pass` every `period_s` for good: a pass that fails (whatever a worker
        answered) is logged, and the next one runs on time."""
        while True:
            try:
                await one_pass()
            except Exception:
                log.exception("the worker set's %s pass failed; next in %.1f s", what,
                              period_s)
            await asyncio.sleep(period_s)

    async def _health_pass(self) -> None:
        try:
            await self.check_all()
            await self._index.refollow_if_restarted(
                s.spec for s in self._workers.values() if s.state == "up")
        finally:
            if not self._first_pass.done():
                self._first_pass.set_result(None)

    async def check_all(self) -> None:
        """One health pass over every worker, concurrently. A worker coming back up must
        also serve the model again (it may have been restarted with another one)."""
        now_s = asyncio.get_running_loop().time()
        for worker_id, until_s in list(self._down_until_s.items()):
            if until_s <= now_s or worker_id not in self._workers:
                del self._down_until_s[worker_id]
        statuses = [s for s in self._workers.values()
                    if s.spec.worker_id not in self._down_until_s]  # backing off: still down
        problems = await asyncio.gather(*(
            check_worker(self._http(), s.spec, self._config.model,
                         self._config.health_timeout_s) if s.state == "down"
            else check_health(self._http(), s.spec, self._config.health_timeout_s)
            for s in statuses))
        for status, problem in zip(statuses, problems):
            await self._set(status.spec.worker_id, "up" if problem is None else "down",
                            problem)

    async def scrape_all(self) -> None:
        """One load pass: each up worker's queue gauges become its stats. A worker whose
        gauges are not queue lengths (or whose scrape fails in any way) has no stats this
        pass, and its sample is counted as rejected; the other workers are unaffected."""
        up = [s for s in self._workers.values() if s.state == "up"]
        found = await asyncio.gather(*(self._scrape(s.spec) for s in up))
        changed = False
        for status, (metrics, rejected) in zip(up, found):
            current = self._workers.get(status.spec.worker_id)
            if current is None or current.state != "up":
                continue
            num_rejected = current.num_rejected_load_samples + rejected
            if ((current.stats, current.kv_capacity_tokens, current.num_rejected_load_samples)
                    != (metrics.stats, metrics.kv_capacity_tokens, num_rejected)):
                self._workers[status.spec.worker_id] = replace(
                    current, stats=metrics.stats, kv_capacity_tokens=metrics.kv_capacity_tokens,
                    num_rejected_load_samples=num_rejected)
                changed = True
        if changed:
            self._bump()

    async def _scrape(self, spec: WorkerSpec) -> tuple[WorkerMetrics, int]:
        """The worker's stats and KV capacity (each None: none usable) and 1 when its
        sample was rejected."""
        try:
            return await scrape_metrics(self._http(), spec, self._config.health_timeout_s), 0
        except Exception as err:  # a lying or broken worker: its own sample only
            if spec.worker_id not in self._warned_load:  # once per worker, not per pass
                self._warned_load.add(spec.worker_id)
                log.warning("worker %s: queue gauges rejected (%s); its load counts the "
                            "gateways' own requests only", spec.worker_id, err)
            return NO_METRICS, 1

    async def _set(self, worker_id: str, state: str, error: str | None) -> None:
        current = self._workers.get(worker_id)
        if current is None or (current.state, current.error) == (state, error):
            return
        self._workers[worker_id] = WorkerStatus(current.spec, state, error)
        self._bump()
        if state == "down":
            log.warning("worker %s is down: %s", worker_id, error)
            await self._index.forget(worker_id)
        else:
            log.info("worker %s is up", worker_id)
            await self._index.follow(current.spec)

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()


WorkerSetActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0,
                            max_concurrency=1000)(WorkerSet)


def get_worker_set_actor(config: WorkerSetConfig) -> ray.actor.ActorHandle:
    """The cluster's `kvroute-workers` actor; the first caller creates it with `config`
    (later callers get that one, whatever config they pass). Blocking."""
    return get_or_create_actor(WorkerSetActor, WORKER_SET_ACTOR_NAME, config)
