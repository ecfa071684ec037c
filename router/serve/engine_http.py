"""The engine replica as its own HTTP server: kvroute's `ingress direct` (direct streaming).

HAProxy (Ray Serve's HAProxy ingress) sends each POST to the replica the ingress request
router picked (router/serve/ingress_endpoint.py) and every other request to any replica, on the
replica's own HTTP port: the whole OpenAI API is answered here, in the engine's process, with
no Ray hop per request or per token. The app is the front door's route table
(worker/openai/routes.py) with kvroute's tenants (API key -> cache salt); the generation
endpoints are the standalone engine's (`OpenAIServing`, worker/openai_server/serving.py);
`/ready`, `/metrics` and `/v1/prefixes` are the gateway's (router/front/routes.py: the index
actor, the metrics hub, pins routed through the engine deployment's own request router).

Each routed request carries a signed route header (set by HAProxy from the router's answer);
the replica reports its arrival and its end, whatever the path and the outcome, to that
router through its next publish to the index actor (router/serve/route_tracking.py), so the
router's load drops.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from prometheus_client import Counter
from ray import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from router.cluster.index_actor import get_index_actor
from router.cluster.metrics_hub import MetricsHubConfig, MetricsPusher, get_metrics_hub
from router.front.engine_client import EngineClient, RetryConfig
from router.front.metrics import CountRequests, GatewayMetrics
from router.front.pin_admin import PinAdmin
from router.front.prefixes import PrefixRegisterRequest, PrefixService
from router.front.routes import cluster_metrics, cluster_ready, pin_routes
from router.front.tenants import TenantAuth, load_api_keys
from router.serve.engine_replica import EngineReplicaBody
from router.serve.route_header import RouteSigner
from router.serve.route_tracking import RouteReports, RouteTracking
from worker.openai.front import FrontDoor, fixed_context
from worker.openai.prompt import PromptBuilder
from worker.openai.routes import OwnRoutes, build_app, route_table
from worker.openai_server.serving import OpenAIServing
from worker.process_settings import ProcessSettings
from worker.tokenizer.files import tokenizer_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineHTTPConfig:
    model: str  # "tiny" or a checkpoint directory (tokenizer and chat template)
    block_size: int
    api_keys_file: str | None = None
    admin_key_file: str | None = None  # only the path travels: Ray logs the configs
    retry: RetryConfig = field(default_factory=RetryConfig)  # pins, routed by Serve
    metrics: MetricsHubConfig = field(default_factory=MetricsHubConfig)
    # verifies the ingress routers' route headers (router/serve/route_header.py)
    route_key: bytes = field(kw_only=True, repr=False)

    def __post_init__(self):
        if self.block_size < 1:
            raise ValueError("EngineHTTPConfig: block_size >= 1 required")
        RouteSigner(self.route_key)  # raises on a short key


class _DirectEngineReplica(EngineReplicaBody):
    async def __init__(self, engine_config, http_config: EngineHTTPConfig,
                       publisher_config=None, metrics_config=None):
        self.route_reports = RouteReports()
        self.http_config = http_config
        await super().__init__(engine_config, publisher_config, metrics_config,
                               route_reports=self.route_reports)

    def __serve_build_asgi_app__(self) -> Starlette:
        return build_engine_app(self)


DirectEngineReplica = serve.deployment(name="EngineReplica")(
    serve.ingress()(_DirectEngineReplica))


def build_engine_app(replica: _DirectEngineReplica) -> Starlette:
    """The replica's OpenAI API (built in the replica, once its engine is up): the front
    door's route table with this replica's engine behind it, the cluster's /ready and
    /metrics, and pins."""
    config, engine = replica.http_config, replica.engine
    model = engine.model_name
    prompts = PromptBuilder(tokenizer_dir(config.model), model, config.block_size)
    metrics = GatewayMetrics(model)
    process = ProcessSettings.from_environ(os.environ)  # limits, keys, quotas
    auth = TenantAuth(load_api_keys(config.api_keys_file, process))
    door = FrontDoor.for_tenants(model, prompts, process, auth,
                                 fixed_context(engine.max_model_len))
    serving = OpenAIServing(engine, door, metrics.latency)
    index, hub = get_index_actor(), get_metrics_hub(config.metrics)
    context = serve.get_replica_context()
    own_deployment = serve.get_deployment_handle(context.deployment, context.app_name)
    pin_admin = PinAdmin.of(auth, config.admin_key_file, process)
    prefixes = PrefixService(EngineClient(own_deployment, config.retry), index, prompts,
                             pin_admin.quota)
    pusher = MetricsPusher(f"gateway/{replica.replica_id}", metrics.registry, config.metrics)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pusher.start()
        # Pinned prefixes whose replica died are pinned again (by one process at a time).
        rewarm = asyncio.get_running_loop().create_task(prefixes.rewarm_orphans())
        try:
            yield
        finally:
            rewarm.cancel()
            await pusher.stop()

    async def completions(request: Request) -> Response:
        return await serving.completions(request, door.tenant(request))

    async def chat_completions(request: Request) -> Response:
        return await serving.chat_completions(request, door.tenant(request))

    own = OwnRoutes(completions, chat_completions, cluster_ready(index), cluster_metrics(hub),
                    extra=pin_routes(door, prefixes, pin_admin, PrefixRegisterRequest))
    app = build_app(route_table(door, own), title="kvroute", lifespan=lifespan)
    app.state.gateway_metrics = metrics
    app.add_middleware(CountRequests)
    # Outermost: every routed request is claimed and ended, whatever answers it (a 404 too).
    forged = Counter("kvroute_gateway_route_header_rejected",
                     "requests whose route header did not verify (not set by HAProxy from an "
                     "ingress router's answer), served as not routed", registry=metrics.registry)
    app.add_middleware(RouteTracking, signer=RouteSigner(config.route_key),
                       reports=replica.route_reports, on_forged=forged.inc)
    return app
