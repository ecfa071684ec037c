"""The OpenAI-compatible gateway in front of external workers.

Per request: authenticate (API key -> tenant -> cache salt), read the prompt, tokenize and
hash it once (Protocol 1), let the Router core pick a worker (router/gateway/external_router.py)
and forward the body there over HTTP, relaying the worker's answer byte for byte
(router/gateway/external_proxy.py). Only OpenAI's fields and kvroute's documented extensions
reach a worker (router/gateway/external_fields.py), and a client that leaves cancels its
request on the worker, streamed or not. Besides the OpenAI routes (and vLLM's /tokenize and
/detokenize, which a worker answers, and /version): `/v1/workers` (the admin API
of the worker set), `/health`, `/ready` (503 while no worker is up; the workers' URLs,
event sockets and errors only with the admin key) and `/metrics` (the cluster's series).
router/gateway/external_app.py makes it an HTTP app, which the gateway process serves
itself: one HTTP hop, no Ray call in the token path.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from router.cluster.external_worker_probe import listed_context
from router.cluster.external_worker_set import WorkerSetConfig, get_worker_set_actor
from router.cluster.external_worker_spec import WorkerSpec, WorkerSpecError, canonical_url
from router.cluster.metrics_hub import (
    MetricsHubConfig,
    MetricsPusher,
    get_metrics_hub,
)
from router.core.hit_curve import HitCurveConfig
from router.core.router import RouterConfig
from router.front.admin_key import AdminAuth, load_admin_key
from router.front.metrics import GatewayMetrics
from router.front.routing_body import Context, off_loop
from router.front.tenants import TenantAuth, load_api_keys
from router.gateway.admin import change_body, spec_from_body, worker_body
from router.gateway.external_fields import CHAT_FIELDS, COMPLETION_FIELDS
from router.gateway.external_proxy import ExternalProxy, ProxyConfig
from router.gateway.external_router import ExternalWorkerRouter, NoWorkerAvailable
from router.gateway.output_tokens import AnswerUsage
from router.gateway.routed_body import RoutedBody, chat_body, completion_body
from worker.openai.errors import APIError
from worker.openai.front import FrontDoor, ready_body
from worker.openai.latency import arrival_of, relayed
from worker.openai.limits import RequestLimits, longest_token_chars
from worker.openai.prompt import PromptBuilder
from worker.openai.stream_slots import StreamSlot
from worker.process_settings import ProcessSettings
from worker.tokenizer.files import tokenizer_dir

log = logging.getLogger(__name__)

_TOKENIZER_THREADS = 2  # reading large bodies for routing (router/front/routing_body.py)
_MODELS_TIMEOUT_S = 2.0  # asking a worker's /v1/models for its context length

BodyReader = Callable[[bytes, PromptBuilder, str, str, RequestLimits, Context | None],
                      RoutedBody]


async def read_off_loop(threads: Executor, read: BodyReader, raw: bytes,
                        prompts: PromptBuilder, model: str, tenant: str,
                        limits: RequestLimits, context: Context | None = None) -> RoutedBody:
    """`read(raw, ...)`: on the loop when the body is small, else in one of `threads`."""
    return await off_loop(threads, len(raw),
                          lambda: read(raw, prompts, model, tenant, limits, context))


@dataclass(frozen=True)
class ExternalGatewayConfig:
    model: str  # the API's model name (what the workers serve) and the hash namespace
    tokenizer: str  # "tiny" or a directory with the model's tokenizer.json
    router: RouterConfig
    worker_set: WorkerSetConfig
    api_keys_file: str | None = None
    admin_key_file: str | None = None
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    metrics: MetricsHubConfig = field(default_factory=MetricsHubConfig)
    bound: HitCurveConfig = field(default_factory=HitCurveConfig)  # if it creates the actor

    def __post_init__(self):
        if self.worker_set.model != self.model:
            raise ValueError(f"ExternalGatewayConfig: the worker set checks model "
                             f"{self.worker_set.model!r}, the gateway serves {self.model!r}")


class ExternalGateway:
    """One gateway process's handlers; `start` connects it to the cluster."""

    def __init__(self, config: ExternalGatewayConfig, gateway_id: str):
        self.config = config
        self.model = config.model
        self.gateway_id = gateway_id
        self.prompts = PromptBuilder(tokenizer_dir(config.tokenizer), config.model,
                                     config.router.block_size)
        process = ProcessSettings.from_environ(os.environ)  # limits, keys
        self.door = FrontDoor.for_tenants(
            config.model, self.prompts, process,
            TenantAuth(load_api_keys(config.api_keys_file, process)), self._workers_context)
        self.admin = AdminAuth(load_admin_key(config.admin_key_file, process))
        self.proxy = ExternalProxy(config.proxy)
        self.limits = self.door.limits
        self._longest_token_chars = longest_token_chars(
            self.prompts.tokenizer.get_vocab(with_added_tokens=True))
        self._tokenizer_threads = ThreadPoolExecutor(_TOKENIZER_THREADS,
                                                     thread_name_prefix="tokenize")
        # (the up workers' ids, the context length they list)
        self._context: tuple[frozenset[str], int | None] | None = None
        self._context_lock = asyncio.Lock()
        self.metrics = GatewayMetrics(self.model)
        self._pusher = MetricsPusher(f"gateway/{gateway_id}", self.metrics.registry,
                                     config.metrics)
        self.workers = None  # the worker-set actor, once started
        self.router: ExternalWorkerRouter | None = None
        self.hub = None

    async def start(self) -> None:
        """Finds (or creates) the cluster actors and reads the worker set once."""
        self.workers = await asyncio.to_thread(get_worker_set_actor, self.config.worker_set)
        self.hub = await asyncio.to_thread(get_metrics_hub, self.config.metrics)
        self.router = ExternalWorkerRouter(self.config.router, self.model, self.gateway_id,
                                           self.workers, metrics_config=self.config.metrics,
                                           bound_config=self.config.bound)
        await self.router.start()
        self._pusher.start()

    async def aclose(self) -> None:
        await self.proxy.aclose()
        self._tokenizer_threads.shutdown(wait=False, cancel_futures=True)

    async def _routed(self, read: BodyReader, raw: bytes, tenant: str) -> RoutedBody:
        """The body as routed: with the workers' context length when one lists it, a
        prompt that cannot fit it is a 400 before it reaches the router's load."""
        tokens = await self._workers_context()
        context = (None if tokens is None
                   else Context(tokens, self._longest_token_chars))
        return await read_off_loop(self._tokenizer_threads, read, raw, self.prompts,
                                   self.model, tenant, self.limits, context)

    # ---- OpenAI API ----

    async def completions(self, request: Request) -> Response:
        return await self._generation(request, "/v1/completions", completion_body,
                                      COMPLETION_FIELDS)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generation(request, "/v1/chat/completions", chat_body, CHAT_FIELDS)

    async def _generation(self, request: Request, path: str, read, fields) -> Response:
        tenant = self.door.tenant(request)
        raw = await self.door.body(request)
        routed = await self._routed(functools.partial(read, fields=fields), raw, tenant)
        return await until_disconnected(request, self._forward(
            path, routed, routed.body, tenant, arrival_of(request.scope)))

    async def _workers_context(self) -> int | None:
        """The context length an up worker lists in its /v1/models (vLLM and kvroute engine
        do), asked again when the up workers change (by one caller: a burst of /v1/models
        asks the workers once); None without one. Keyed on the up workers, not the set's
        version: that grows with every scrape of their queue gauges, and asking again then
        put a client's setup and a busy worker's answer in some requests' TTFT."""
        up = self.router.view.up() if self.router is not None else ()
        key = frozenset(status.spec.worker_id for status in up)
        if self._context is not None and self._context[0] == key:
            return self._context[1]
        async with self._context_lock:
            if self._context is None or self._context[0] != key:
                tokens = None
                async with httpx.AsyncClient(trust_env=False) as client:
                    for status in up:
                        tokens = await listed_context(client, status.spec, self.model,
                                                      _MODELS_TIMEOUT_S)
                        if tokens is not None:
                            break
                self._context = (key, tokens)
            return self._context[1]

    async def tokenizer_call(self, request: Request) -> Response:
        """/tokenize and /detokenize, answered by a worker that is up (it knows its own
        context length, which vLLM's /tokenize reports)."""
        self.door.tenant(request)
        raw = await self.door.body(request)
        up = [w.spec for w in self.router.view.up()]

        def pick(tried: frozenset[str]) -> WorkerSpec:
            for spec in up:
                if spec.worker_id not in tried:
                    return spec
            raise APIError(503, "no worker is up", type_="service_unavailable_error",
                           code="worker_unavailable")

        return await until_disconnected(request, self.proxy.forward(
            request.url.path, raw, pick, lambda *_, **__: None))

    # ---- the worker set (admin key) ----

    async def list_workers(self, request: Request) -> JSONResponse:
        self.admin.check(request.headers.get("authorization"))
        view = await self.workers.poll.remote(-1)
        return JSONResponse({"object": "list",
                             "data": [worker_body(w) for w in view.workers]})

    async def add_worker(self, request: Request) -> JSONResponse:
        self.admin.check(request.headers.get("authorization"))
        spec = spec_from_body(await self.door.body(request))
        body = change_body(await self.workers.add.remote(spec))
        return JSONResponse(body, status_code=201)

    async def remove_worker(self, request: Request) -> JSONResponse:
        self.admin.check(request.headers.get("authorization"))
        try:
            worker_id = canonical_url(request.query_params.get("url", ""))
        except WorkerSpecError as err:
            raise APIError(400, f"give the worker as ?url=...: {err}", param="url",
                           code="invalid_value") from None
        return JSONResponse(change_body(await self.workers.remove.remote(worker_id)))

    # ---- operations ----

    async def ready(self, request: Request) -> JSONResponse:
        """200 while a worker is up. The body counts the workers; with the admin key it
        lists each (URL, event sockets, state, and why a down one is): those name internal
        addresses and quote the workers' errors, which are not everyone's to read."""
        view = self.router.view
        details: dict = {"num_workers": len(view.workers), "num_workers_up": len(view.up())}
        if self._is_admin(request):
            details["workers"] = [worker_body(w) for w in view.workers]
        body, status = ready_body(bool(view.up()), **details)
        return JSONResponse(body, status_code=status)

    def _is_admin(self, request: Request) -> bool:
        try:
            self.admin.check(request.headers.get("authorization"))
        except APIError:
            return False
        return True

    # ---- internals ----

    async def _forward(self, path: str, routed: RoutedBody, body: bytes, tenant: str,
                       arrival_s: float) -> Response:
        hashes = self.prompts.block_hashes(routed.token_ids, tenant)
        latency = self.metrics.latency
        base_id = uuid.uuid4().hex
        request_ids: dict[str, str] = {}  # worker id -> the request id routed there

        def pick(tried: frozenset[str]) -> WorkerSpec:
            request_id = f"{base_id}~{len(tried)}"
            try:
                worker, _ = self.router.route(request_id, hashes, len(routed.token_ids),
                                              routed.max_tokens, tried, routed.num_sequences)
            except NoWorkerAvailable as err:
                log.warning("no worker can take request %s: %s", request_id, err)
                raise APIError(503, "no worker can take the request",
                               type_="service_unavailable_error",
                               code="worker_unavailable") from None
            request_ids[worker.worker_id] = request_id
            if not tried:  # tokenized, hashed and routed: handed to the first worker
                latency.preprocess.observe(latency.clock() - arrival_s)
            return worker

        def release(worker_id: str, error: str | None, *, refused: bool = False,
                    violation: bool = False, output_tokens: int | None = None,
                    usage: AnswerUsage | None = None) -> None:
            self.router.release(request_ids.pop(worker_id), error, refused=refused,
                                violation=violation, output_tokens=output_tokens,
                                usage=usage)

        # every request, streamed or not: 429 before any routing or worker work
        slot = StreamSlot(self.door.streams, tenant)
        try:
            response = await self.proxy.forward(path, body, pick, release)
        except BaseException:
            slot.release()
            raise
        if isinstance(response, StreamingResponse):
            response.body_iterator = slot.hold(
                relayed(latency, arrival_s, response.body_iterator))
            return response
        slot.release()  # a JSON answer (not streamed, or an error), read whole: it is over
        if response.status_code < 400:
            latency.e2e.observe(latency.clock() - arrival_s)
        return response


CLIENT_GONE = 499  # nginx's "client closed request": counted, sent to no one


async def until_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """`work`'s response, or, when the client disconnects first, `work` cancelled (the
    proxy closes its connection to the worker, which then aborts the request: vLLM and
    `kvroute engine` do) and a 499. Once a stream has begun, Starlette's StreamingResponse
    watches the client itself; this covers the wait before it (a non-streamed request's
    whole life, a stream's queueing)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return Response(status_code=CLIENT_GONE)


async def _disconnect(request: Request) -> None:
    """Returns when the client disconnects (its body was read whole already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
