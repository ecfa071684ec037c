"""One engine replica as a Ray Serve deployment.

Each Serve replica owns one `Engine` and one placement group with a bundle per TP rank
(`engine_deployment_options`); rank 0 is the replica actor itself. It streams token deltas
to the gateway, publishes its KV events and load stats to the KV index actor, pushes its
metrics registry to the metrics hub, and on shutdown finishes what it accepted: Serve stops
routing to it and waits for ongoing calls (up to `graceful_shutdown_timeout_s`), then
`__del__` drains the engine and says goodbye to the index.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from ray import serve

from kv.events import ContentsDigest, contents_digest
from protocol.engine import (
    EngineRequest,
    PinRequest,
    PinResult,
    ReplicaQuery,
    TokenDelta,
    UnpinRequest,
)
from router.cluster.hit_bound import HitBoundLink
from router.cluster.index_actor import find_index
from router.cluster.metrics_hub import MetricsHubConfig, MetricsPusher
from router.serve.publisher import PublisherConfig, ReplicaPublisher, RouteReportSource
from worker.engine.config import EngineConfig
from worker.engine.engine import Engine
from worker.openai_server.vllm_metrics import VLLMGaugeCollector


@dataclass(frozen=True)
class ReplicaResources:
    """What each TP rank of a replica reserves (one placement-group bundle per rank)."""

    cpus_per_rank: float = 1.0
    gpus_per_rank: float = 0.0
    max_ongoing_requests: int = 256  # Serve's per-replica cap; the engine queues the rest
    graceful_shutdown_timeout_s: float = 30.0

    def __post_init__(self):
        if not self.cpus_per_rank > 0:
            raise ValueError(f"cpus_per_rank must be > 0, got {self.cpus_per_rank}")
        if self.gpus_per_rank < 0:
            raise ValueError(f"gpus_per_rank must be >= 0, got {self.gpus_per_rank}")
        if self.max_ongoing_requests < 1:
            raise ValueError(f"max_ongoing_requests must be >= 1, got "
                             f"{self.max_ongoing_requests}")

    def bundle(self) -> dict[str, float]:
        out = {"CPU": self.cpus_per_rank}
        if self.gpus_per_rank:
            out["GPU"] = self.gpus_per_rank
        return out


class EngineReplicaBody:
    """Serve replica wrapping one engine; its replica id is Serve's replica tag. (The class
    the deployments wrap: `EngineReplica` here, `DirectEngineReplica` with its own HTTP
    server in router/serve/engine_http.py.)"""

    async def __init__(self, engine_config: EngineConfig,
                 publisher_config: PublisherConfig | None = None,
                 metrics_config: MetricsHubConfig | None = None,
                 route_reports: RouteReportSource | None = None):
        start_s = time.monotonic()
        self.replica_id = serve.get_replica_context().replica_tag
        config = dataclasses.replace(engine_config, replica_id=self.replica_id)
        self.engine = await asyncio.to_thread(Engine.from_config, config)
        engine_s = time.monotonic() - start_s
        self._publisher = ReplicaPublisher(self.engine, find_index, publisher_config,
                                           route_reports, self.replica_id)
        await self._publisher.publish_once()  # known to the index before the first request
        self._publisher.start()
        self._metrics = MetricsPusher(f"engine/{self.replica_id}",
                                      pushed_registry(self.engine, self.replica_id),
                                      metrics_config)
        self._metrics.start()
        # finished sequences, sampled for the pooled bound (router/cluster/hit_bound.py):
        # their generated blocks are cached when they end, and no router sees them
        self._bound = HitBoundLink(f"engine/{self.replica_id}", config.block_size)
        self.engine.on_finished = self._bound.sampler.on_released
        self._bound.start()
        # The start's slowest part, per replica, on the process's own stdout, which Ray
        # streams to the console of `kvroute serve` (Serve sends a replica's sys.stdout
        # to its buffered log file instead).
        sys.__stdout__.write(f"kvroute: engine replica {self.replica_id} ({config.model}) up "
                             f"in {time.monotonic() - start_s:.1f} s (engine built in "
                             f"{engine_s:.1f} s)\n")
        sys.__stdout__.flush()

    async def generate(self, request: EngineRequest) -> AsyncIterator[TokenDelta]:
        """Streams the request's deltas. Cancelled by the caller (client gone): the engine
        aborts the request when this generator closes."""
        async for delta in self.engine.generate(request):
            yield delta

    async def pin_prefix(self, request: PinRequest) -> PinResult:
        num_blocks = await self.engine.pin_prefix(request.name, request.prompt_token_ids,
                                                  request.cache_salt)
        return PinResult(self.replica_id, num_blocks)

    async def unpin_prefix(self, request: UnpinRequest) -> bool:
        return unpin_if_mine(self.engine, self.replica_id, request)

    def cache_digest(self, query: ReplicaQuery) -> ContentsDigest | None:
        """What this replica holds, fingerprinted (None when asked of another replica)."""
        if query.target_replica_id != self.replica_id:
            return None
        snap = self.engine.snapshot()
        return contents_digest(snap.device_hashes, snap.host_hashes)

    def check_health(self) -> None:
        """Serve's periodic health check: a failing engine gets this replica replaced."""
        self.engine.check_health()

    def replica_info(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "model": self.engine.model_name,
                "max_model_len": self.engine.max_model_len}

    async def __del__(self):
        await self.engine.shutdown()
        await self._publisher.stop(self.replica_id)
        await self._metrics.stop()
        self._bound.stop()


EngineReplica = serve.deployment(name="EngineReplica")(EngineReplicaBody)


def engine_deployment_options(num_replicas: int, tp: int, resources: ReplicaResources,
                              request_router_config: Any) -> dict[str, Any]:
    """`EngineReplica.options(...)` for N replicas of TP ranks each."""
    bundle = resources.bundle()
    return {
        "num_replicas": num_replicas,
        "max_ongoing_requests": resources.max_ongoing_requests,
        "graceful_shutdown_timeout_s": resources.graceful_shutdown_timeout_s,
        "graceful_shutdown_wait_loop_s": 0.5,
        "placement_group_bundles": [dict(bundle) for _ in range(tp)],
        "placement_group_strategy": "PACK",
        "ray_actor_options": {"num_cpus": bundle["CPU"], "num_gpus": bundle.get("GPU", 0)},
        "request_router_config": request_router_config,
        "health_check_period_s": 2.0,
        "health_check_timeout_s": 30.0,
    }


def pushed_registry(engine: Engine, replica_id: str) -> CollectorRegistry:
    """What a replica pushes to the metrics hub: its engine's kvroute_engine_* series and
    vLLM's gauge names (vllm:num_requests_waiting, ..., as `kvroute engine` serves them) read
    from the engine at each push, so llm-d's endpoint picker and vLLM dashboards can read a
    Serve replica as they read a vLLM pod."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(engine.registry)
    registry.register(VLLMGaugeCollector(engine.stats, engine.model_name,
                                         replica_id=replica_id))
    return registry


def unpin_if_mine(engine, replica_id: str, request: UnpinRequest) -> bool:
    """Unpins only on the replica the request names. Aimed at a dead replica, Serve routes
    it to another one, whose pin of the same name is a newer one: keep it (a no-op)."""
    if request.target_replica_id != replica_id:
        return False
    return engine.unpin_prefix(request.name)
