"""vLLM's scheduler and cache gauges, read from the engine when Prometheus scrapes.

Routers and autoscalers of the vLLM ecosystem (and kvroute's own external-worker backend)
read a worker's load from these names, so a kvroute engine exports them as vLLM v1 does:
labels `model_name` and `engine`, usage as a fraction in [0, 1] despite the `_perc` name.
`gpu_cache_usage_perc` is the older (v0) name of `kv_cache_usage_perc`; both are exported
because consumers still read either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from protocol.engine import EngineStats

LABELS = ("model_name", "engine")


def kv_cache_usage(stats: EngineStats) -> float:
    """Blocks that cannot be handed out now, as a fraction of the pool: held by requests or
    pinned. Cached blocks nobody references are evictable, so they count as free (as in
    vLLM)."""
    if stats.num_blocks == 0:
        return 0.0
    return (stats.num_used_blocks + stats.num_pinned_blocks) / stats.num_blocks


class VLLMGaugeCollector(Collector):
    """Collects the gauges from `stats()` at scrape time, so they are never stale."""

    def __init__(self, stats: Callable[[], EngineStats], model_name: str,
                 engine_index: int = 0, replica_id: str | None = None,
                 block_size: int | None = None):
        """`replica_id`: also label each series `replica` (kvroute's Serve replicas, which
        share one metrics hub: their series must not merge). `block_size` (tokens): also
        export `vllm:cache_config_info`, whose `num_gpu_blocks` x `block_size` is the KV
        capacity a router in front of the worker reads (router/cluster/external_worker_probe.py)."""
        self._stats = stats
        self._block_size = block_size
        self._labels = LABELS + (("replica",) if replica_id is not None else ())
        self._label_values = [model_name, str(engine_index)]
        if replica_id is not None:
            self._label_values.append(replica_id)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self._stats()
        usage = kv_cache_usage(stats)
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.",
             stats.num_running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
             stats.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage),
            ("vllm:gpu_cache_usage_perc", "KV-cache usage (the v0 name). 1 means 100 percent "
             "usage.", usage),
        ):
            family = GaugeMetricFamily(name, doc, labels=self._labels)
            family.add_metric(self._label_values, value)
            yield family
        if self._block_size is not None:
            # vLLM's info gauge: its cache config as labels, value 1
            info = ("block_size", "num_gpu_blocks", "num_cpu_blocks", "enable_prefix_caching")
            family = GaugeMetricFamily("vllm:cache_config_info",
                                       "Information of the LLMEngine CacheConfig",
                                       labels=self._labels + info)
            family.add_metric(self._label_values + [str(self._block_size),
                                                    str(stats.num_blocks),
                                                    str(stats.num_host_blocks), "True"], 1.0)
            yield family
