"""What the worker set tells the KV index actor: which workers' KV events to follow.

A worker with a KV event socket (`#kv_events=` in its spec) is followed while it is up, under
its worker id (router/cluster/external_workers.py maps its vLLM-format events to Protocol 1
hashes with the router's model name and block size). Down or removed, it is no longer
followed and its index is dropped. A restarted index actor has forgotten whom it followed:
`refollow_if_restarted` notices (a new incarnation) and follows them again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Protocol

import ray

from router.cluster.external_worker_spec import WorkerSpec
from router.cluster.index_actor import get_index_actor
from router.cluster.vllm_subscriber_spec import SubscriberSpec
from router.core.engine_hash_map import EngineHashConfig

log = logging.getLogger(__name__)


class IndexLink(Protocol):
    """The worker set's side of the KV index (the tests record the calls instead)."""

    async def follow(self, spec: WorkerSpec) -> None: ...
    async def forget(self, worker_id: str) -> None: ...
    async def refollow_if_restarted(self, up: Iterable[WorkerSpec]) -> None: ...


class IndexActorLink:
    """The KV index actor as the worker set's IndexLink. Failures are logged, never raised:
    a worker whose events are not followed is routed on routed history meanwhile."""

    def __init__(self, model: str, block_size: int):
        self._hashing = EngineHashConfig(model=model, router_block_size=block_size)
        self._index = None
        self._incarnation: str | None = None

    async def _actor(self):
        if self._index is None:
            self._index = await asyncio.to_thread(get_index_actor)
        return self._index

    async def follow(self, spec: WorkerSpec) -> None:
        if spec.kv_events_endpoint is None:
            return  # no events: routed on routed history
        try:
            index = await self._actor()
            if self._incarnation is None:
                self._incarnation = await index.get_incarnation.remote()
            await index.add_external_worker.remote(SubscriberSpec(
                spec.worker_id, spec.kv_events_endpoint, self._hashing,
                replay_endpoint=spec.kv_replay_endpoint))
        except ray.exceptions.RayError as err:
            self._index = None
            log.warning("could not follow the KV events of worker %s: %r", spec.worker_id, err)

    async def forget(self, worker_id: str) -> None:
        try:
            index = await self._actor()
            await index.remove_external_worker.remote(worker_id)
            await index.forget_replica.remote(worker_id)
        except ray.exceptions.RayError as err:
            self._index = None
            log.warning("could not drop the index of worker %s: %r", worker_id, err)

    async def refollow_if_restarted(self, up: Iterable[WorkerSpec]) -> None:
        if self._incarnation is None:
            return  # nothing followed yet
        try:
            incarnation = await (await self._actor()).get_incarnation.remote()
        except ray.exceptions.RayError as err:
            self._index = None
            log.warning("index actor unreachable: %r", err)
            return
        if incarnation != self._incarnation:
            log.warning("the index actor restarted: following the workers' events again")
            self._incarnation = incarnation
            for spec in up:
                await self.follow(spec)
