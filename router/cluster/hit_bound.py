"""The hit-bound actor: the fleet's pooled LRU hit ratio, online, from sampled accesses.

Every deciding router samples its routed prompts (router/core/access_sampler.py), every
engine replica its finished sequences, and both send the samples here a few times a second
(`HitBoundLink`). The named actor `kvroute-hit-bound`
replays them in arrival order (router/core/hit_curve.py) and exports, through the metrics
hub, what one LRU holding every replica's blocks would hit:

    kvroute_pooled_hit_ratio{capacity="0.5x"|"1x"|"2x"|"4x"|"inf", window="recent"|"all"}
    kvroute_pooled_sampled_accesses_total

The capacity multiples are of the fleet's current device KV capacity in blocks, as the
routers last saw it in the replicas' published stats (the sum of their `num_blocks`); until
one has, only the "inf" rung is exported. Kept apart from the KV index actor so that its
replay work never delays an index poll. A restarted actor starts its curve afresh.

The sample rate is the actor's: it lowers it as the fleet's capacity grows
(router/core/hit_curve.py), and each `record` answers with it, so a router or replica
samples its next batch at it. A batch sampled denser is thinned on arrival; one sampled
sparser (by a sender that outlived a restarted actor) lowers the actor's rate to its own.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import ray
from prometheus_client import CollectorRegistry, Counter, Gauge

from router.cluster.actor_link import ActorLink
from router.cluster.actors import KVROUTE_NAMESPACE, get_or_create_actor
from router.cluster.metrics_hub import MetricsPusher
from router.core.access_sampler import AccessBatch, AccessSampler, SamplerConfig
from router.core.hit_curve import WINDOWS, HitCurveConfig, PooledHitCurve

log = logging.getLogger(__name__)

HIT_BOUND_NAME = "kvroute-hit-bound"
CAPACITY_MULTIPLES = (("0.5x", 0.5), ("1x", 1.0), ("2x", 2.0), ("4x", 4.0), ("inf", math.inf))


class HitBound:
    """Replays routers' batches; owns the series. Plain Python: the actor wraps it."""

    def __init__(self, config: HitCurveConfig | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.curve = PooledHitCurve(config, clock)
        self.capacity_blocks: int | None = None  # as the latest batch that knew it said
        self.num_rejected_batches = 0
        self.registry = r = CollectorRegistry()
        self._ratio = Gauge("kvroute_pooled_hit_ratio",
                            "Online pooled LRU hit ratio in tokens (SHARDS sample) at a "
                            "multiple of the fleet's device KV capacity",
                            ("capacity", "window"), registry=r)
        self._sampled = Counter("kvroute_pooled_sampled_accesses",
                                "Sampled block accesses replayed for the pooled bound",
                                registry=r)
        self._num_counted = 0
        self._pusher: MetricsPusher | None = None

    def add(self, batch: AccessBatch) -> bool:
        """Replays one batch; False (and nothing counted) when it was sampled more sparsely
        than the sparsest rate R, which the curve cannot be read at."""
        rate = self.curve.config.sample_rate
        if batch.sample_rate < rate:
            self.num_rejected_batches += 1
            log.warning("a batch from %s sampled at %g < %g: dropped", batch.source_id,
                        batch.sample_rate, rate)
            return False
        if batch.capacity_blocks is not None:
            self.capacity_blocks = batch.capacity_blocks
            self.curve.set_capacity(batch.capacity_blocks)
        if batch.num_prompt_tokens:
            self.curve.add_prompts(batch.prompts(), batch.sample_rate, batch.num_blocks,
                                   batch.num_prompt_tokens, batch.block_size)
        self.curve.add_released(batch.released(), batch.sample_rate)
        return True

    def refresh(self) -> None:
        """Sets the series from the curve (before each push to the metrics hub)."""
        self._sampled.inc(self.curve.num_sampled_accesses - self._num_counted)
        self._num_counted = self.curve.num_sampled_accesses
        labels = [label for label, _ in CAPACITY_MULTIPLES]
        capacities = [math.inf if multiple == math.inf
                      else None if self.capacity_blocks is None
                      else multiple * self.capacity_blocks
                      for _, multiple in CAPACITY_MULTIPLES]
        known = [c for c in capacities if c is not None]
        for window in WINDOWS:
            ratios = iter(self.curve.counts(window).hit_ratios(
                known, self.curve.config.sample_rate))
            for label, capacity in zip(labels, capacities):
                ratio = None if capacity is None else next(ratios)
                if ratio is None:
                    try:
                        self._ratio.remove(label, window)
                    except KeyError:
                        pass
                else:
                    self._ratio.labels(label, window).set(ratio)

    # ---- the actor's remote methods ----

    async def record(self, batch: AccessBatch) -> float:
        """Replays the batch; returns the rate to sample the next one at."""
        if self._pusher is None and ray.is_initialized():
            self._pusher = MetricsPusher("hit-bound", self.registry, before_push=self.refresh)
            self._pusher.start()
        self.add(batch)
        return self.curve.sample_rate

    def hit_ratio(self, capacity_blocks: float, window: str) -> float | None:
        return self.curve.hit_ratio(capacity_blocks, window)

    def sample_rate(self) -> float:
        return self.curve.sample_rate

    def stats(self) -> dict[str, float | int | None]:
        return {"num_sampled_accesses": self.curve.num_sampled_accesses,
                "capacity_blocks": self.capacity_blocks,
                "num_rejected_batches": self.num_rejected_batches,
                "sample_rate": self.curve.sample_rate}


HitBoundActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(HitBound)


def get_hit_bound(config: HitCurveConfig | None = None) -> ray.actor.ActorHandle:
    """The cluster's `kvroute-hit-bound` actor, created by the first process that asks."""
    return get_or_create_actor(HitBoundActor, HIT_BOUND_NAME, config or HitCurveConfig())


def find_hit_bound() -> ray.actor.ActorHandle:
    """The actor if a router created it (raises ValueError until then)."""
    return ray.get_actor(HIT_BOUND_NAME, namespace=KVROUTE_NAMESPACE)


class HitBoundLink:
    """A process's sampler and the loop that sends its batches to the actor.

    A router (`config` given: the serve settings') creates the actor with its config. An
    engine replica (`config` None) only finds it: a replica up before any router creates
    nothing, and its held sequences wait (up to the sampler's cap) until the actor is found.
    Either asks the actor's rate before its first batch (a router started after the actor
    lowered it would otherwise send one batch at the starting rate), then samples at the
    rate each `record` answers with.
    """

    def __init__(self, source_id: str, block_size: int, config: HitCurveConfig | None = None,
                 send_interval_s: float = 0.5):
        self.config = config
        self.sampler = AccessSampler(source_id, block_size, SamplerConfig(sample_rate=1.0))
        self._rate_known = False
        self.capacity_blocks: int | None = None  # the router sets it from replica stats
        self._interval_s = send_interval_s
        self._task: asyncio.Task | None = None
        self._link = ActorLink(f"pooled-bound samples from {source_id}",
                               find_hit_bound if config is None else
                               lambda: get_hit_bound(config))

    def start(self) -> None:
        """Sends what was sampled every `send_interval_s`, on the running event loop; an
        empty sampler asks nothing of the actor (an idle replica never looks for it)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while ray.is_initialized():
            if not self.sampler.is_empty:
                await self._link.try_call(self._send)
            await asyncio.sleep(self._interval_s)

    async def send_once(self) -> None:
        await self._link.call(self._send)

    async def _send(self, actor: ray.actor.ActorHandle) -> None:
        if not self._rate_known:
            self.sampler.set_sample_rate(await actor.sample_rate.remote())
            self._rate_known = True
        batch = self.sampler.take(self.capacity_blocks)
        if batch is not None:
            rate = await actor.record.remote(batch)
            if rate != self.sampler.config.sample_rate:
                self.sampler.set_sample_rate(rate)
