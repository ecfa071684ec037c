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

from ray import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from router.cluster.index_actor import get_index_actor
from router.cluster.metrics_hub import MetricsHubConfig, MetricsPusher, get_metrics_hub
from router.front.engine_client import EngineClient, ReplicaLost, RetryConfig, unavailable
from router.front.metrics import CountRequests, GatewayMetrics
from router.front.pin_admin import PinAdmin
from router.front.prefixes import PrefixRegisterRequest, PrefixService
from router.front.process import process_id
from router.front.routes import cluster_metrics, cluster_ready, pin_routes
from router.front.tenants import TenantAuth, load_api_keys
from worker.openai.choices import Choices, collect, replay
from worker.openai.engine_params import Kind, engine_requests
from worker.openai.errors import APIError
from worker.openai.front import FrontDoor
from worker.openai.latency import arrival_of
from worker.openai.logprobs import LogprobsFormatter
from worker.openai.prompt import PromptBuilder
from worker.openai.responses import ResponseShape
from worker.openai.routes import OwnRoutes, build_app, route_table
from worker.openai.schema import ChatCompletionRequest, CompletionRequest
from worker.openai.stream_slots import StreamSlot
from worker.openai.streaming import full_response, sse_events
from worker.process_settings import ProcessSettings
from worker.tokenizer.files import tokenizer_dir

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


class _Gateway:
    async def __init__(self, engine_handle, config: GatewayConfig):
        self.config = config
        self.model = config.served_model_name
        self.gateway_id = process_id()
        prompts = PromptBuilder(tokenizer_dir(config.model), self.model, config.block_size)
        self.logprobs = LogprobsFormatter(prompts.tokenizer)
        process = ProcessSettings.from_environ(os.environ)  # limits, keys, quotas
        auth = TenantAuth(load_api_keys(config.api_keys_file, process))
        self.door = FrontDoor.for_tenants(self.model, prompts, process, auth,
                                          self._known_context)
        self.engine = EngineClient(engine_handle, config.retry)
        self._engine_handle = engine_handle
        self._max_model_len: int | None = None  # the replicas' own context limit
        self.index = get_index_actor()
        self.hub = get_metrics_hub(config.metrics)
        self.pin_admin = PinAdmin.of(auth, config.admin_key_file, process)
        self.prefixes = PrefixService(self.engine, self.index, prompts, self.pin_admin.quota)
        self.metrics = GatewayMetrics(self.model)
        self._pusher = MetricsPusher(f"gateway/{self.gateway_id}", self.metrics.registry,
                                     config.metrics)
        self._pusher.start()
        # The first call creates this process's request router (its index mirror and its
        # per-replica series, at 0 from the start); do it now rather than at the first request.
        self._warmup = asyncio.get_running_loop().create_task(self._warm_up())
        # Pinned prefixes whose replica died are pinned again (by one gateway at a time).
        self._rewarm = asyncio.get_running_loop().create_task(self.prefixes.rewarm_orphans())

    def __serve_build_asgi_app__(self) -> Starlette:
        """The front door's route table with the engine replicas (through Serve) behind it,
        the cluster's /ready and /metrics, and pins; its OpenAPI document describes the
        request bodies."""
        own = OwnRoutes(self.completions, self.chat_completions, cluster_ready(self.index),
                        cluster_metrics(self.hub),
                        extra=pin_routes(self.door, self.prefixes, self.pin_admin,
                                         PrefixRegisterRequest))
        app = build_app(route_table(self.door, own), title="kvroute", openapi=True)
        app.state.gateway_metrics = self.metrics
        app.add_middleware(CountRequests)
        return app

    # ---- OpenAI API ----

    async def completions(self, request: Request) -> Response:
        tenant = self.door.tenant(request)
        body, prompts = await self.door.completion_request(request, self._context_limit)
        return await self._generate("completion", "cmpl", body, prompts, tenant,
                                    arrival_of(request.scope))

    async def chat_completions(self, request: Request) -> Response:
        tenant = self.door.tenant(request)
        body, token_ids = await self.door.chat_request(request, self._context_limit)
        return await self._generate("chat", "chatcmpl", body, [token_ids], tenant,
                                    arrival_of(request.scope))

    # ---- internals ----

    async def _warm_up(self) -> None:
        try:
            await self._context_limit()
        except Exception as err:  # the engines are not up yet: the first request does it
            log.warning("gateway warm-up call failed: %r", err)

    async def _context_limit(self) -> int:
        """Prompt + max_tokens must fit in this: the engine replicas report it."""
        if self._max_model_len is None:
            try:
                info = await self._engine_handle.replica_info.remote()
            except Exception as err:  # Ray's text names actors and hosts: logged only
                log.warning("no engine replica answered replica_info: %r", err)
                raise unavailable("no engine replica answered yet; retry the request"
                                  ) from None
            self._max_model_len = int(info["max_model_len"])
        return self._max_model_len

    async def _known_context(self) -> int | None:
        try:
            return await self._context_limit()
        except APIError:  # no replica answered yet
            return None

    async def _generate(self, kind: Kind, id_prefix: str,
                        body: CompletionRequest | ChatCompletionRequest,
                        prompts: list[list[int]], tenant: str, arrival_s: float
                        ) -> Response:
        response_id = f"{id_prefix}-{uuid.uuid4().hex}"
        requests = engine_requests(kind, response_id, body, prompts,
                                   await self._context_limit(), tenant,
                                   lambda ids: self.door.prompts.block_hashes(ids, tenant))
        shape = ResponseShape.new(kind, response_id, self.model)
        timer = self.metrics.latency.timer(arrival_s)  # each choice's deltas, observed
        timer.dispatched()
        # every request, streamed or not: 429 + Retry-After over the tenant's limit
        slot = StreamSlot(self.door.streams, tenant)
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


Gateway = serve.deployment(name="Gateway")(serve.ingress()(_Gateway))
