"""One scrape target for a multi-process Ray Serve cluster (docs/metrics.md).

Each kvroute process keeps its own `prometheus_client` registry and a `MetricsPusher` sends a
snapshot of it (the collected metric families) to the named actor `kvroute-metrics` every
`push_interval_s`. The gateway's `/metrics` asks the hub for the exposition of the union:
families of the same name from several processes are merged into one family, so the text
has one HELP/TYPE header per name as the format requires. A source that stops pushing for
`3 x push_interval_s` is dropped.

Each snapshot also names the Ray node (its IP) of the process that pushed it, so a scrape can
ask for one node's processes only (`/metrics?node=IP`): Kubernetes then scrapes every pod as
its own target and each series carries the pod and node it comes from (docs/metrics.md).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import ray
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from router.cluster.actor_link import ActorLink
from router.cluster.actors import get_or_create_actor

log = logging.getLogger(__name__)

METRICS_HUB_NAME = "kvroute-metrics"


@dataclass(frozen=True)
class MetricsHubConfig:
    push_interval_s: float = 1.0
    stale_after_intervals: int = 3

    def __post_init__(self):
        if not self.push_interval_s > 0:
            raise ValueError(f"push_interval_s must be > 0, got {self.push_interval_s}")
        if self.stale_after_intervals < 1:
            raise ValueError(
                f"stale_after_intervals must be >= 1, got {self.stale_after_intervals}"
            )


class _Families:
    """A collector over already-collected families (for `generate_latest`)."""

    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def merge_families(sources: list[list[Metric]]) -> list[Metric]:
    """Families of the same name from several sources merged into one family each.

    Most series carry their process's `replica` or `gateway` label and never collide. A
    series that several processes export with the same labels (the gateway's request
    counter, by design without a gateway label) is summed, as a counter or histogram of the
    whole service should be; its `_created` timestamp is the earliest.
    """
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple, float]] = {}
    for families in sources:
        for fam in families:
            if fam.name not in merged:
                merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                values[fam.name] = {}
            series = values[fam.name]
            for sample in fam.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                old = series.get(key)
                if old is None:
                    series[key] = sample.value
                elif sample.name.endswith("_created"):
                    series[key] = min(old, sample.value)
                else:
                    series[key] = old + sample.value
    for name, fam in merged.items():
        for (sample_name, labels), value in values[name].items():
            fam.add_sample(sample_name, dict(labels), value)
    return list(merged.values())


def exposition(families: list[Metric]) -> bytes:
    """Prometheus text exposition (format 0.0.4) of the given families."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


@dataclass(frozen=True)
class _Snapshot:
    pushed_at_s: float  # time.monotonic() of the push
    node_ip: str | None  # the pushing process's Ray node; None: unknown (matches no node)
    families: list[Metric]


class MetricsHub:
    """Latest snapshot per source; serves the merged exposition of the live ones."""

    def __init__(self, config: MetricsHubConfig | None = None):
        self._config = config or MetricsHubConfig()
        self._snapshots: dict[str, _Snapshot] = {}

    def push(self, source_id: str, families: list[Metric], node_ip: str | None = None) -> None:
        self._snapshots[source_id] = _Snapshot(time.monotonic(), node_ip, families)

    def drop(self, source_id: str) -> None:
        self._snapshots.pop(source_id, None)

    def live_sources(self) -> list[str]:
        self._expire()
        return sorted(self._snapshots)

    def exposition(self, node_ip: str | None = None) -> bytes:
        """The merged series of every live source, or with `node_ip` of those on that node."""
        self._expire()
        return exposition(merge_families([
            snap.families for snap in self._snapshots.values()
            if node_ip is None or snap.node_ip == node_ip]))

    def _expire(self) -> None:
        cutoff = self._config.push_interval_s * self._config.stale_after_intervals
        now = time.monotonic()
        for source_id in [s for s, snap in self._snapshots.items()
                          if now - snap.pushed_at_s > cutoff]:
            del self._snapshots[source_id]


MetricsHubActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(MetricsHub)


def get_metrics_hub(config: MetricsHubConfig | None = None) -> ray.actor.ActorHandle:
    """The cluster's `kvroute-metrics` actor, created by the first process that asks."""
    return get_or_create_actor(MetricsHubActor, METRICS_HUB_NAME, config or MetricsHubConfig())


# The pushers of this process, so that the process answering a scrape can push its own
# series first (they are then current, not up to one interval old).
_LOCAL_PUSHERS: weakref.WeakSet = weakref.WeakSet()


async def flush_local_pushers() -> None:
    for pusher in list(_LOCAL_PUSHERS):
        try:
            await pusher.push_once()
        except ray.exceptions.RayError as err:
            log.warning("metrics push from %s failed: %s", pusher.source_id, err)


class MetricsPusher:
    """Pushes one registry to the hub every `push_interval_s` from an asyncio task."""

    def __init__(self, source_id: str, registry: CollectorRegistry,
                 config: MetricsHubConfig | None = None,
                 before_push: Callable[[], None] | None = None):
        self.source_id = source_id
        self._before_push = before_push  # refreshes gauges computed on demand
        self._registry = registry
        self._node_ip: str | None = None  # this process's Ray node, looked up at first push
        self._config = config or MetricsHubConfig()
        self._hub = ActorLink(f"metrics push from {source_id}",
                              lambda: get_metrics_hub(self._config))
        _LOCAL_PUSHERS.add(self)

    def start(self) -> None:
        interval_s = self._config.push_interval_s
        self._hub.start(self._push, interval_s, retry_interval_s=interval_s)

    async def push_once(self) -> None:
        await self._hub.call(self._push)

    async def stop(self, drop: bool = True) -> None:
        self._hub.stop()
        hub = self._hub.found_handle
        if drop and hub is not None:
            try:
                await hub.drop.remote(self.source_id)
            except ray.exceptions.RayError:
                pass

    async def _push(self, hub: ray.actor.ActorHandle) -> None:
        if self._before_push is not None:
            self._before_push()
        if self._node_ip is None:
            self._node_ip = ray.util.get_node_ip_address()
        await hub.push.remote(self.source_id, list(self._registry.collect()), self._node_ip)
