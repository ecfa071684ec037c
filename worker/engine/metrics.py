"""Engine series of docs/metrics.md, in a per-replica prometheus_client registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kv.manager import KVCacheManager

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class EngineMetrics:
    def __init__(self, model: str, replica_id: str, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r, labels = self.registry, ("model", "replica")
        self._labels = dict(model=model, replica=replica_id)

        def counter(name, doc, extra=()):
            return Counter(name, doc, labels + extra, registry=r)

        def gauge(name, doc, extra=()):
            return Gauge(name, doc, labels + extra, registry=r)

        def hist(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        self.prompt_tokens = counter("kvroute_engine_prompt_tokens", "Prompt tokens received")
        self.generation_tokens = counter("kvroute_engine_generation_tokens", "Tokens generated")
        self.query_tokens = counter("kvroute_engine_prefix_cache_query_tokens",
                                    "Prompt tokens looked up in the prefix cache")
        self.hit_tokens = counter("kvroute_engine_prefix_cache_hit_tokens",
                                  "Prompt tokens served from cache (delivered hits)", ("medium",))
        self.kv_blocks = gauge("kvroute_engine_kv_blocks", "KV blocks by state", ("state",))
        self.capacity = gauge("kvroute_engine_kv_capacity_blocks", "Pool size in blocks",
                              ("medium",))
        self.evictions = counter("kvroute_engine_evictions", "Cached blocks evicted",
                                 ("medium",))
        self.preemptions = counter("kvroute_engine_preemptions", "Requests preempted")
        self.requests = gauge("kvroute_engine_requests", "Requests by state", ("state",))
        self.queued_prefill = gauge("kvroute_engine_queued_prefill_tokens",
                                    "Prompt tokens not yet computed")
        self.ttft = hist("kvroute_engine_ttft_seconds", "Time to first token",
                         LATENCY_BUCKETS_S)
        self.tpot = hist("kvroute_engine_tpot_seconds", "Time per output token after the first",
                         TPOT_BUCKETS_S)
        self.e2e = hist("kvroute_engine_e2e_seconds", "Request latency, arrival to finish",
                        LATENCY_BUCKETS_S)
        self.finished = counter("kvroute_engine_requests_finished", "Finished requests",
                                ("reason",))
        # Touch every labelled child so all series exist from the start (rates need a 0).
        for medium in ("device", "host"):
            self.hit_tokens.labels(**self._labels, medium=medium)
            self.evictions.labels(**self._labels, medium=medium)
        for reason in ("stop", "length", "abort", "error"):
            self.finished.labels(**self._labels, reason=reason)
        for m in (self.prompt_tokens, self.generation_tokens, self.query_tokens,
                  self.preemptions, self.ttft, self.tpot, self.e2e):
            m.labels(**self._labels)
        self._seen = {"query": 0, "device": 0, "host": 0, "evict_device": 0, "evict_host": 0,
                      "preempt": 0}

    def series(self, metric, **extra):
        """This replica's series of `metric` (its model and replica labels, plus `extra`)."""
        return metric.labels(**self._labels, **extra)

    def update_from(self, kv: KVCacheManager, num_preemptions: int, num_running: int,
                    num_waiting: int, num_queued_prefill_tokens: int) -> None:
        """Moves cumulative engine counters into Prometheus and refreshes gauges."""
        now = {"query": kv.stats.query_tokens, "device": kv.stats.device_hit_tokens,
               "host": kv.stats.host_hit_tokens, "evict_device": kv.pool.num_evictions,
               "evict_host": kv.host.num_evictions, "preempt": num_preemptions}
        d = {k: now[k] - self._seen[k] for k in now}
        self._seen = now
        self.series(self.query_tokens).inc(d["query"])
        self.series(self.hit_tokens, medium="device").inc(d["device"])
        self.series(self.hit_tokens, medium="host").inc(d["host"])
        self.series(self.evictions, medium="device").inc(d["evict_device"])
        self.series(self.evictions, medium="host").inc(d["evict_host"])
        self.series(self.preemptions).inc(d["preempt"])
        for state, n in kv.usage().items():
            self.series(self.kv_blocks, state=state).set(n)
        self.series(self.capacity, medium="device").set(kv.pool.num_blocks)
        self.series(self.capacity, medium="host").set(kv.host.num_blocks)
        self.series(self.requests, state="running").set(num_running)
        self.series(self.requests, state="waiting").set(num_waiting)
        self.series(self.queued_prefill).set(num_queued_prefill_tokens)
