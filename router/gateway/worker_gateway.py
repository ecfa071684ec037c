"""The OpenAI-compatible gateway in front of external workers (a Ray Serve FastAPI deployment).

Per request: authenticate (API key -> tenant -> cache salt), read the prompt, tokenize and
hash it once (Protocol 1), let the Router core pick a worker (router/serve/worker_router.py)
and forward the body there over HTTP, relaying the worker's answer byte for byte
(router/gateway/worker_proxy.py): one HTTP hop, no Ray call in the token path. Besides the
OpenAI routes: `/v1/workers` (the admin API of the worker set), `/health`, `/ready` (503
naming the workers that are down while none is up) and `/metrics` (the cluster's series).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from router.cluster.metrics_hub import (
    MetricsHubConfig,
    MetricsPusher,
    flush_local_pushers,
    get_metrics_hub,
)
from router.cluster.worker_set import WorkerSetConfig, get_worker_set_actor
from router.cluster.worker_spec import WorkerSpecError, canonical_url
from router.core.router import RouterConfig
from router.gateway.admin import AdminAuth, change_body, load_admin_key, spec_from_body, worker_body
from router.gateway.metrics import GatewayMetrics
from router.gateway.openai_schema import APIError
from router.gateway.prompt import PromptBuilder
from router.gateway.routed_body import RoutedBody, chat_body, completion_body
from router.gateway.tenants import TenantAuth, load_api_keys
from router.gateway.worker_proxy import ProxyConfig, WorkerProxy
from router.serve.request_router import gateway_process_id
from router.serve.worker_router import NoWorkerAvailable, WorkerRouter
from worker.tokenizer_files import tokenizer_dir


@dataclass(frozen=True)
class WorkerGatewayConfig:
    model: str  # the API's model name (what the workers serve) and the hash namespace
    tokenizer: str  # "tiny" or a directory with the model's tokenizer.json
    router: RouterConfig
    worker_set: WorkerSetConfig
    api_keys_file: str | None = None
    admin_key_file: str | None = None
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    metrics: MetricsHubConfig = field(default_factory=MetricsHubConfig)

    def __post_init__(self):
        if self.worker_set.model != self.model:
            raise ValueError(f"WorkerGatewayConfig: the worker set checks model "
                             f"{self.worker_set.model!r}, the gateway serves {self.model!r}")


app = FastAPI(title="kvroute (external workers)", docs_url=None, redoc_url=None)


@app.exception_handler(APIError)
async def _api_error(request: Request, err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status_code)


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
    return JSONResponse(APIError(err.status_code, str(err.detail), code=code).body(),
                        status_code=err.status_code)


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
    return JSONResponse(APIError(400, f"invalid request: {err.errors()[:1]}").body(),
                        status_code=400)


@app.middleware("http")
async def _count_requests(request: Request, call_next):
    response = await call_next(request)
    metrics = getattr(request.app.state, "gateway_metrics", None)
    if metrics is not None:
        metrics.observe(request.url.path, response.status_code)
    return response


@serve.deployment(name="WorkerGateway")
@serve.ingress(app)
class WorkerGateway:
    async def __init__(self, config: WorkerGatewayConfig):
        self.config = config
        self.model = config.model
        gateway_id = gateway_process_id()
        self.prompts = PromptBuilder(tokenizer_dir(config.tokenizer), config.model,
                                     config.router.block_size)
        self.auth = TenantAuth(load_api_keys(config.api_keys_file))
        self.admin = AdminAuth(load_admin_key(config.admin_key_file))
        self.workers = await asyncio.to_thread(get_worker_set_actor, config.worker_set)
        self.router = WorkerRouter(config.router, config.model, gateway_id, self.workers,
                                   metrics_config=config.metrics)
        await self.router.start()
        self.proxy = WorkerProxy(config.proxy)
        self.hub = await asyncio.to_thread(get_metrics_hub, config.metrics)
        self.metrics = GatewayMetrics(self.model)
        self._pusher = MetricsPusher(f"gateway/{gateway_id}", self.metrics.registry,
                                     config.metrics)
        app.state.gateway_metrics = self.metrics
        self._pusher.start()

    # ---- OpenAI API ----

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        tenant = self.auth.tenant_of(request.headers.get("authorization"))
        routed = completion_body(await request.body(), self.prompts, self.model, tenant)
        return await self._forward("/v1/completions", routed, tenant)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        tenant = self.auth.tenant_of(request.headers.get("authorization"))
        routed = chat_body(await request.body(), self.prompts, self.model, tenant)
        return await self._forward("/v1/chat/completions", routed, tenant)

    @app.get("/v1/models")
    async def models(self, request: Request) -> dict:
        self.auth.tenant_of(request.headers.get("authorization"))
        return {"object": "list", "data": [{"id": self.model, "object": "model",
                                            "created": 0, "owned_by": "kvroute"}]}

    # ---- the worker set (admin key) ----

    @app.get("/v1/workers")
    async def list_workers(self, request: Request) -> dict:
        self.admin.check(request.headers.get("authorization"))
        view = await self.workers.poll.remote(-1)
        return {"object": "list", "data": [worker_body(w) for w in view.workers]}

    @app.post("/v1/workers", status_code=201)
    async def add_worker(self, request: Request) -> dict:
        self.admin.check(request.headers.get("authorization"))
        spec = spec_from_body(await request.body())
        return change_body(await self.workers.add.remote(spec))

    @app.delete("/v1/workers")
    async def remove_worker(self, request: Request, url: str = "") -> dict:
        self.admin.check(request.headers.get("authorization"))
        try:
            worker_id = canonical_url(url)
        except WorkerSpecError as err:
            raise APIError(400, f"give the worker as ?url=...: {err}", param="url",
                           code="invalid_value") from None
        return change_body(await self.workers.remove.remote(worker_id))

    # ---- operations ----

    @app.get("/health")
    async def health(self) -> dict:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready(self) -> JSONResponse:
        """200 while a worker is up; the body lists every worker, and why a down one is."""
        view = self.router.view
        ready = bool(view.up())
        body = {"ready": ready, "workers": [worker_body(w) for w in view.workers]}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics_endpoint(self) -> Response:
        await flush_local_pushers()  # this process's series (gateway, router) are current
        return Response(await self.hub.exposition.remote(), media_type=CONTENT_TYPE_LATEST)

    # ---- internals ----

    async def _forward(self, path: str, routed: RoutedBody, tenant: str) -> Response:
        hashes = self.prompts.block_hashes(routed.token_ids, tenant)
        base_id = uuid.uuid4().hex
        request_ids: dict[str, str] = {}  # worker id -> the request id routed there

        def pick(tried: frozenset[str]):
            request_id = f"{base_id}~{len(tried)}"
            try:
                worker, _ = self.router.route(request_id, hashes, len(routed.token_ids),
                                              routed.max_tokens, tried)
            except NoWorkerAvailable as err:
                raise APIError(503, f"no worker can take the request: {err}",
                               type_="service_unavailable_error",
                               code="worker_unavailable") from None
            request_ids[worker.worker_id] = request_id
            return worker

        def release(worker_id: str, error: str | None) -> None:
            self.router.release(request_ids.pop(worker_id), error)

        return await self.proxy.forward(path, routed.body, pick, release)
