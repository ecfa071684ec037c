"""The KV index actor's calls that hand over to a part it keeps: the named pinned prefixes
(router/cluster/prefix_registry.py) and the followed external workers
(router/cluster/external_workers.py). Mixed into `KVIndex` (router/cluster/index_actor.py),
whose state they use: the calls reach the actor like its own, one named actor for all."""

from __future__ import annotations

import ray
from prometheus_client import CollectorRegistry

from router.cluster.external_workers import ExternalWorkers, ExternalWorkerStatus
from router.cluster.metrics_hub import MetricsPusher
from router.cluster.pin_quota import PinQuota, PinRefusal
from router.cluster.prefix_registry import PrefixRecord, PrefixRegistry
from router.cluster.vllm_subscriber_spec import SubscriberSpec


class PrefixCalls:
    """The pinned-prefix records, kept in the actor so that every router sees one set
    (rebuilt from the replicas' own pins after a restart)."""

    prefixes: PrefixRegistry

    def reserve_prefix(self, tenant: str, name: str, num_blocks: int, block_size: int,
                       quota: PinQuota) -> PinRefusal | None:
        return self.prefixes.reserve(tenant, name, num_blocks, block_size, quota)

    def release_prefix(self, tenant: str, name: str) -> None:
        self.prefixes.release(tenant, name)

    def put_prefix(self, record: PrefixRecord) -> PrefixRecord | None:
        return self.prefixes.put(record)

    def pop_prefix(self, tenant: str, name: str) -> PrefixRecord | None:
        return self.prefixes.pop(tenant, name)

    async def claim_orphaned_prefixes(self, wait_s: float, lease_s: float = 60.0
                                      ) -> list[PrefixRecord]:
        return await self.prefixes.claim_orphans(wait_s, lease_s)

    def place_prefix(self, orphan: PrefixRecord, placed: PrefixRecord) -> bool:
        return self.prefixes.place(orphan, placed)

    def release_claim(self, orphan: PrefixRecord) -> None:
        self.prefixes.release_claim(orphan)


class ExternalWorkerCalls:
    """External workers (vLLM, SGLang, `kvroute engine`) the actor follows over ZMQ, added
    and removed at runtime."""

    external_workers: ExternalWorkers
    _external_metrics: MetricsPusher | None

    async def add_external_worker(self, spec: SubscriberSpec) -> None:
        """Follows a worker's vLLM-format KV events (again from scratch if followed)."""
        await self.external_workers.add(spec)
        if self._external_metrics is None and ray.is_initialized():
            registry = CollectorRegistry()
            registry.register(self.external_workers)
            self._external_metrics = MetricsPusher("index/external-workers", registry)
            self._external_metrics.start()

    async def remove_external_worker(self, worker_id: str) -> bool:
        """Stops following a worker and drops its index; False when it was not followed."""
        return await self.external_workers.remove(worker_id)

    def external_worker_modes(self) -> dict[str, str]:
        return self.external_workers.modes()

    def external_worker_status(self) -> dict[str, ExternalWorkerStatus]:
        return self.external_workers.status()
