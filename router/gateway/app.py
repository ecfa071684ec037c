"""The OpenAI-compatible HTTP ingress (a Ray Serve FastAPI deployment).

Per request: authenticate (API key -> tenant -> cache salt), validate the body, refuse text
that cannot fit the context, tokenize and apply the chat template once (a large body in a
thread, off the loop that serves everyone), hash the prompt's blocks once (model name as
namespace), and send ids + hashes to the engine replica the request router picks. Every bad
input is a 4xx with an OpenAI-style error body; a dead replica is a 503 after retries
elsewhere.
"""


import asyncio
import logging
import os
import uuid
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
from router.gateway.engine_client import EngineClient, ReplicaLost, RetryConfig, unavailable
from router.gateway.metrics import CountRequests, GatewayMetrics
from router.gateway.pin_admin import PinAdmin
from router.gateway.prefixes import PrefixRegisterRequest, PrefixService
from router.gateway.tenants import TenantAuth, load_api_keys
from router.serve.request_router import gateway_process_id
from worker.openai.choices import Choices, collect, replay
from worker.openai.engine_params import Kind, engine_requests
from worker.openai.errors import APIError
from worker.openai.http_errors import install_error_handlers
from worker.openai.latency import arrival_of
from worker.openai.limits import read_body
from worker.openai.logprobs import LogprobsFormatter
from worker.openai.openapi_body import request_body
from worker.openai.prompt import PromptBuilder
from worker.openai.prompt_encoder import PromptEncoder
from worker.openai.responses import ResponseShape
from worker.openai.schema import ChatCompletionRequest, CompletionRequest, parse_body
from worker.openai.stream_slots import StreamSlot, StreamSlots
from worker.openai.streaming import full_response, sse_events
from worker.openai.tokenize import (
    DetokenizeRequest,
    TokenizeCompletionRequest,
    detokenize,
    tokenize,
    version_body,
)
from worker.process_settings import ProcessSettings
from worker.tokenizer_files import tokenizer_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewayConfig:
    model: str  # "tiny" or a checkpoint directory (for the tokenizer and chat template)
    served_model_name: str  # the API's model name and the hash namespace
    block_size: int
    api_keys_file: str | None = None
    admin_key_file: str | None = None  # only the path travels: Ray logs the configs
    retry: RetryConfig = field(default_factory=RetryConfig)
    metrics: MetricsHubConfig = field(default_factory=MetricsHubConfig)

    def __post_init__(self):
        if self.block_size < 1:
            raise ValueError("GatewayConfig: block_size >= 1 required")


app = FastAPI(title="kvroute", docs_url=None, redoc_url=None)


install_error_handlers(app)


app.add_middleware(CountRequests)


@serve.deployment(name="Gateway")
@serve.ingress(app)
class Gateway:
    async def __init__(self, engine_handle, config: GatewayConfig):
        self.config = config
        self.model = config.served_model_name
        self.gateway_id = gateway_process_id()
        process = ProcessSettings.from_environ(os.environ)  # limits, keys, quotas
        self.limits = process.request_limits()
        self.prompts = PromptBuilder(tokenizer_dir(config.model), self.model, config.block_size)
        self.encoder = PromptEncoder(self.prompts)  # long prompts off the event loop
        self.logprobs = LogprobsFormatter(self.prompts.tokenizer)
        self.auth = TenantAuth(load_api_keys(config.api_keys_file, process))
        self.streams = StreamSlots.for_tenants(self.auth.enabled,
                                               process.max_streams_per_tenant)
        self.engine = EngineClient(engine_handle, config.retry)
        self._engine_handle = engine_handle
        self._max_model_len: int | None = None  # the replicas' own context limit
        self.index = get_index_actor()
        self.hub = get_metrics_hub(config.metrics)
        self.pin_admin = PinAdmin.of(self.auth, config.admin_key_file, process)
        self.prefixes = PrefixService(self.engine, self.index, self.prompts,
                                      self.pin_admin.quota)
        self.metrics = GatewayMetrics(self.model)
        self._pusher = MetricsPusher(f"gateway/{self.gateway_id}", self.metrics.registry,
                                     config.metrics)
        app.state.gateway_metrics = self.metrics
        self._pusher.start()
        # The first call creates this process's request router (its index mirror and its
        # per-replica series, at 0 from the start); do it now rather than at the first request.
        self._warmup = asyncio.get_running_loop().create_task(self._warm_up(engine_handle))
        # Pinned prefixes whose replica died are pinned again (by one gateway at a time).
        self._rewarm = asyncio.get_running_loop().create_task(self.prefixes.rewarm_orphans())

    # ---- OpenAI API ----

    @app.post("/v1/completions", openapi_extra=request_body(CompletionRequest))
    async def completions(self, request: Request) -> Response:
        tenant = self.auth.tenant_of(request.headers.get("authorization"))
        body = parse_body(await read_body(request, self.limits), CompletionRequest,
                          self.limits)
        self._check_model(body.model)
        prompts = await self.encoder.completion(body.prompts(), await self._context_limit())
        return await self._generate("completion", "cmpl", body, prompts, tenant,
                                    arrival_of(request.scope))

    @app.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest))
    async def chat_completions(self, request: Request) -> Response:
        tenant = self.auth.tenant_of(request.headers.get("authorization"))
        body = parse_body(await read_body(request, self.limits), ChatCompletionRequest,
                          self.limits)
        self._check_model(body.model)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        token_ids = await self.encoder.chat(messages, await self._context_limit())
        return await self._generate("chat", "chatcmpl", body, [token_ids], tenant,
                                    arrival_of(request.scope))

    @app.get("/v1/models")
    async def models(self, request: Request) -> dict:
        self.auth.tenant_of(request.headers.get("authorization"))
        return {"object": "list", "data": [{"id": self.model, "object": "model",
                                            "created": 0, "owned_by": "kvroute"}]}

    @app.post("/tokenize", openapi_extra=request_body(TokenizeCompletionRequest))
    async def tokenize_endpoint(self, request: Request) -> dict:
        self.auth.tenant_of(request.headers.get("authorization"))
        return tokenize(await read_body(request, self.limits), self.prompts, self._check_model,
                        await self._context_limit(), self.limits)

    @app.post("/detokenize", openapi_extra=request_body(DetokenizeRequest))
    async def detokenize_endpoint(self, request: Request) -> dict:
        self.auth.tenant_of(request.headers.get("authorization"))
        return detokenize(await read_body(request, self.limits), self.prompts,
                          self._check_model, self.limits)

    @app.get("/version")
    async def version(self) -> dict:
        return version_body()

    # ---- pinned prefixes ----

    @app.post("/v1/prefixes", openapi_extra=request_body(PrefixRegisterRequest))
    async def register_prefix(self, request: Request) -> dict:
        tenant = self.pin_admin.tenant_for_change(request.headers)
        return await self.prefixes.register(await read_body(request, self.limits), tenant,
                                            self._check_model)

    @app.get("/v1/prefixes")
    async def list_prefixes(self, request: Request) -> dict:
        tenant = self.auth.tenant_of(request.headers.get("authorization"))
        return await self.prefixes.list(tenant)

    @app.delete("/v1/prefixes/{name}")
    async def delete_prefix(self, name: str, request: Request) -> dict:
        tenant = self.pin_admin.tenant_for_change(request.headers)
        return await self.prefixes.delete(name, tenant)

    # ---- operations ----

    @app.get("/health")
    async def health(self) -> dict:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready(self) -> JSONResponse:
        replica_ids = await self.index.replica_ids.remote()
        body = {"ready": bool(replica_ids), "replicas": replica_ids}
        return JSONResponse(body, status_code=200 if replica_ids else 503)

    @app.get("/metrics")
    async def metrics_endpoint(self, node: str | None = None) -> Response:
        """Every process's series, or with `?node=IP` those of the processes on that Ray
        node (a per-pod scrape target, see the chart's PodMonitor)."""
        await flush_local_pushers()  # this process's series (gateway, router) are current
        return Response(await self.hub.exposition.remote(node),
                        media_type=CONTENT_TYPE_LATEST)

    # ---- internals ----

    async def _warm_up(self, engine_handle) -> None:
        try:
            await self._context_limit()
        except Exception as err:  # the engines are not up yet: the first request does it
            log.warning("gateway warm-up call failed: %r", err)

    async def _context_limit(self) -> int:
        """Prompt + max_tokens must fit in this: the engine replicas report it."""
        if self._max_model_len is None:
            try:
                info = await self._engine_handle.replica_info.remote()
            except Exception as err:
                raise unavailable(f"no engine replica answered: {err!r}") from None
            self._max_model_len = int(info["max_model_len"])
        return self._max_model_len

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model:
            raise APIError(404, f"the model {model!r} does not exist; this server serves "
                                f"{self.model!r}", param="model", code="model_not_found")

    async def _generate(self, kind: Kind, id_prefix: str,
                        body: CompletionRequest | ChatCompletionRequest,
                        prompts: list[list[int]], tenant: str, arrival_s: float
                        ) -> Response:
        response_id = f"{id_prefix}-{uuid.uuid4().hex}"
        requests = engine_requests(kind, response_id, body, prompts,
                                   await self._context_limit(), tenant,
                                   lambda ids: self.prompts.block_hashes(ids, tenant))
        shape = ResponseShape.new(kind, response_id, self.model)
        timer = self.metrics.latency.timer(arrival_s)  # each choice's deltas, observed
        timer.dispatched()
        # every request, streamed or not: 429 + Retry-After over the tenant's limit
        slot = StreamSlot(self.streams, tenant)
        if not body.stream:
            # each choice whole, retried from the start on a lost replica
            choices = Choices(requests, body.n, lambda request: replay(
                lambda r: self.engine.complete(r, timer.watch), request))
            try:
                await choices.start()
                return JSONResponse(full_response(shape, await collect(choices), body.n,
                                                  self.logprobs))
            finally:
                slot.release()
        choices = Choices(requests, body.n,
                          lambda request: timer.watch(self.engine.stream(request)))
        try:
            await choices.start()  # errors before the first tokens are plain 4xx/503
        except BaseException:
            slot.release()
            raise
        events = sse_events(shape, choices, body.include_usage(), self.logprobs,
                            lost_errors=(ReplicaLost,))
        return StreamingResponse(slot.hold(events), media_type="text/event-stream")
