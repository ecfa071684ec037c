"""The engine replica as its own HTTP server: kvroute's `ingress direct` (direct streaming).

HAProxy (Ray Serve's HAProxy ingress) sends each POST to the replica the ingress request
router picked (router/serve/ingress_router.py) and every other request to any replica, on the
replica's own HTTP port: the whole OpenAI API is answered here, in the engine's process, with
no Ray hop per request or per token. The generation endpoints are the standalone engine's
(`OpenAIServing`, worker/openai_server/serving.py) with kvroute's tenants (API key -> cache
salt); `/ready`, `/metrics` and `/v1/prefixes` answer as the gateway's do (the index actor,
the metrics hub, pins routed through the engine deployment's own request router).

Each routed request carries `ROUTE_HEADER` (set by HAProxy from the router's answer, never by
the client); when it ends (finished, failed, or the client left) the replica reports it to
that router through its next publish to the index actor, so the router's load drops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from ray import serve

from router.cluster.index_actor import get_index_actor
from router.cluster.metrics_hub import (
    MetricsHubConfig,
    MetricsPusher,
    flush_local_pushers,
    get_metrics_hub,
)
from router.gateway.engine_client import EngineClient, RetryConfig
from router.gateway.metrics import CountRequests, GatewayMetrics
from router.gateway.pin_admin import PinAdmin
from router.gateway.prefixes import PrefixService
from router.gateway.tenants import TenantAuth, load_api_keys
from router.serve.engine_replica import EngineReplicaBody
from router.serve.ingress_router import ROUTE_HEADER, ROUTED_BY_HEADER
from worker.openai.http_errors import install_error_handlers
from worker.openai.limits import RequestLimits, read_body
from worker.openai.prompt import PromptBuilder
from worker.openai.stream_slots import StreamSlots
from worker.openai.tokenize import detokenize, tokenize, version_body
from worker.openai_server.serving import OpenAIServing
from worker.tokenizer_files import tokenizer_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineHTTPConfig:
    model: str  # "tiny" or a checkpoint directory (tokenizer and chat template)
    block_size: int
    api_keys_file: str | None = None
    retry: RetryConfig = field(default_factory=RetryConfig)  # pins, routed by Serve
    metrics: MetricsHubConfig = field(default_factory=MetricsHubConfig)

    def __post_init__(self):
        if self.block_size < 1:
            raise ValueError("EngineHTTPConfig: block_size >= 1 required")


class RouteEnds:
    """Route ids that ended here since the publisher last took them, by router id."""

    def __init__(self) -> None:
        self._ended: dict[str, list[str]] = {}

    def add(self, header: str | None) -> None:
        """Records the end of the request that carried `ROUTE_HEADER` (none: not routed by
        an ingress router, e.g. a GET or a retried request, nothing to report)."""
        if not header:
            return
        router_id, _, route_id = header.partition(" ")
        if router_id and route_id:
            self._ended.setdefault(router_id, []).append(route_id)

    def take(self) -> dict[str, tuple[str, ...]]:
        ended, self._ended = self._ended, {}
        return {router_id: tuple(ids) for router_id, ids in ended.items()}


class _DirectEngineReplica(EngineReplicaBody):
    async def __init__(self, engine_config, http_config: EngineHTTPConfig,
                       publisher_config=None, metrics_config=None):
        self.route_ends = RouteEnds()
        self.http_config = http_config
        await super().__init__(engine_config, publisher_config, metrics_config,
                               take_route_ends=self.route_ends.take)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_engine_app(self)


DirectEngineReplica = serve.deployment(name="EngineReplica")(
    serve.ingress()(_DirectEngineReplica))


async def _then(body: AsyncIterator[bytes], done: Callable[[], None]) -> AsyncIterator[bytes]:
    """`body`, then `done()`: also when the stream stops early (the client left)."""
    try:
        async for chunk in body:
            yield chunk
    finally:
        done()


def build_engine_app(replica: _DirectEngineReplica) -> FastAPI:
    """The replica's OpenAI API (built in the replica, once its engine is up)."""
    config, engine = replica.http_config, replica.engine
    model = engine.model_name
    prompts = PromptBuilder(tokenizer_dir(config.model), model, config.block_size)
    metrics = GatewayMetrics(model)
    limits = RequestLimits.from_env()  # the chart's `limits` values
    auth = TenantAuth(load_api_keys(config.api_keys_file))
    serving = OpenAIServing(engine, prompts, metrics.latency, limits,
                            StreamSlots.for_tenants(auth.enabled))
    index, hub = get_index_actor(), get_metrics_hub(config.metrics)
    context = serve.get_replica_context()
    own_deployment = serve.get_deployment_handle(context.deployment, context.app_name)
    pin_admin = PinAdmin.from_env(auth)
    prefixes = PrefixService(EngineClient(own_deployment, config.retry), index, prompts,
                             pin_admin.quota)
    pusher = MetricsPusher(f"gateway/{replica.replica_id}", metrics.registry, config.metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pusher.start()
        # Pinned prefixes whose replica died are pinned again (by one process at a time).
        rewarm = asyncio.get_running_loop().create_task(prefixes.rewarm_orphans())
        try:
            yield
        finally:
            rewarm.cancel()
            await pusher.stop()

    app = FastAPI(title="kvroute", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    install_error_handlers(app)
    app.state.gateway_metrics = metrics
    app.add_middleware(CountRequests)

    async def generate(request: Request,
                       endpoint: Callable[[Request, str], Awaitable[Response]]) -> Response:
        route = request.headers.get(ROUTE_HEADER)
        try:
            tenant = auth.tenant_of(request.headers.get("authorization"))
            response = await endpoint(request, tenant)
        except BaseException:
            replica.route_ends.add(route)
            raise
        if route:  # which router routed it: clients and tests see the routing step worked
            response.headers[ROUTED_BY_HEADER] = route.split(" ", 1)[0]
        if isinstance(response, StreamingResponse):
            response.body_iterator = _then(response.body_iterator,
                                           lambda: replica.route_ends.add(route))
        else:
            replica.route_ends.add(route)
        return response

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, serving.completions)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, serving.chat_completions)

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        auth.tenant_of(request.headers.get("authorization"))
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                            "owned_by": "kvroute",
                                            "max_model_len": engine.max_model_len}]}

    @app.post("/v1/prefixes")
    async def register_prefix(request: Request) -> dict:
        tenant = pin_admin.tenant_for_change(request.headers)
        raw = await read_body(request, limits)
        return await prefixes.register(raw, tenant, serving.check_model)

    @app.get("/v1/prefixes")
    async def list_prefixes(request: Request) -> dict:
        return await prefixes.list(auth.tenant_of(request.headers.get("authorization")))

    @app.delete("/v1/prefixes/{name}")
    async def delete_prefix(name: str, request: Request) -> dict:
        tenant = pin_admin.tenant_for_change(request.headers)
        return await prefixes.delete(name, tenant)

    # A POST's body with a prompt is routed like a completion (HAProxy asks the router for
    # every POST): its route ends here too, or the router would count it as load.
    @app.post("/tokenize")
    async def tokenize_endpoint(request: Request) -> dict:
        try:
            auth.tenant_of(request.headers.get("authorization"))
            return tokenize(await read_body(request, limits), prompts,
                            serving.check_model, engine.max_model_len, limits)
        finally:
            replica.route_ends.add(request.headers.get(ROUTE_HEADER))

    @app.post("/detokenize")
    async def detokenize_endpoint(request: Request) -> dict:
        try:
            auth.tenant_of(request.headers.get("authorization"))
            return detokenize(await read_body(request, limits), prompts,
                              serving.check_model, limits)
        finally:
            replica.route_ends.add(request.headers.get(ROUTE_HEADER))

    @app.get("/version")
    async def version() -> dict:
        return version_body()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        replica_ids = await index.replica_ids.remote()
        return JSONResponse({"ready": bool(replica_ids), "replicas": replica_ids},
                            status_code=200 if replica_ids else 503)

    @app.get("/metrics")
    async def metrics_endpoint(node: str | None = None) -> Response:
        """Every process's series, or with `?node=IP` those on that Ray node (per pod)."""
        await flush_local_pushers()  # this process's series (engine, gateway) are current
        return Response(await hub.exposition.remote(node), media_type=CONTENT_TYPE_LATEST)

    return app
