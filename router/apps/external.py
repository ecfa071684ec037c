"""The Serve application in front of external workers: gateway replicas only.

`kvroute serve --workers URL,...` (or a Serve config's `workers` arg) deploys `gateways`
replicas of the external gateway (router/gateway/external_gateway.py); the workers run
elsewhere. Each replica serves HTTP itself on the configured host and port (shared by the
replicas of a node), so Serve's proxy is not used: deploy with `proxy_location` Disabled.
`check_workers` is what `kvroute serve` runs before it starts anything: every listed worker
must answer its health check and serve the model.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

import httpx
from ray import serve
from ray.serve import Application

from router.cluster.external_worker_probe import check_worker
from router.cluster.external_worker_set import WorkerSetConfig
from router.cluster.external_worker_spec import WorkerSpec, parse_workers
from router.core.hit_curve import HitCurveConfig
from router.core.router import RouterConfig
from router.front.http_server import HttpConfig, HttpServer
from router.gateway.external_app import create_app
from router.gateway.external_gateway import ExternalGateway, ExternalGatewayConfig
from router.serve.request_router import gateway_process_id
from router.serve.serve_env import key_paths, replica_env, with_env
from router.serve.settings import ServeSettings


@serve.deployment(name="WorkerGateway")
class ExternalGatewayReplica:
    """One gateway process: the gateway's handlers behind its own HTTP server."""

    async def __init__(self, config: ExternalGatewayConfig, http: HttpConfig):
        self.gateway = ExternalGateway(config, gateway_process_id())
        await self.gateway.start()
        self.server = HttpServer(create_app(self.gateway), http)
        await self.server.start()

    def check_health(self) -> None:
        if not self.server.serving:
            raise RuntimeError("the gateway's HTTP server stopped")

    async def __del__(self) -> None:
        server = getattr(self, "server", None)  # absent when the constructor failed
        if server is not None:
            await server.stop()  # lets accepted requests finish first
        await self.gateway.aclose()


def external_gateway_config(args: ServeSettings) -> ExternalGatewayConfig:
    """Raises ValueError (WorkerSpecError) naming a bad worker or setting."""
    # The model name is the workers' (what they list in /v1/models), taken verbatim.
    worker_set = WorkerSetConfig(model=args.model, block_size=args.block_size,
                                 workers=parse_workers(args.workers),
                                 health_period_s=args.worker_health_period_s)
    return ExternalGatewayConfig(model=args.model, tokenizer=args.tokenizer or args.model,
                               router=RouterConfig(**args.router_args()),
                               worker_set=worker_set, bound=HitCurveConfig(**args.bound_args()),
                               **key_paths(args))


def workers_application(args: ServeSettings, http: HttpConfig) -> Application:
    return ExternalGatewayReplica.options(
        num_replicas=args.gateways,
        ray_actor_options=with_env({"num_cpus": 0}, replica_env(args, os.environ)),
        graceful_shutdown_timeout_s=http.graceful_shutdown_timeout_s + 10.0,
    ).bind(external_gateway_config(args), http)


def check_workers(specs: Sequence[WorkerSpec], model: str, timeout_s: float = 5.0
                  ) -> list[str]:
    """What is wrong with each unusable worker (one message per worker, naming it)."""
    async def check_all() -> list[str | None]:
        async with httpx.AsyncClient(trust_env=False) as client:
            return await asyncio.gather(*(check_worker(client, s, model, timeout_s)
                                          for s in specs))

    return [p for p in asyncio.run(check_all()) if p is not None]
