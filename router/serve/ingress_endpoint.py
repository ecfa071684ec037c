"""Direct streaming's routing step: HAProxy asks this deployment which engine replica serves
a request, then sends the request straight to that replica's own HTTP port.

HAProxy (Ray Serve's HAProxy ingress with an ingress request router, as Serve LLM's direct
streaming uses it) calls `POST /internal/route` with the client's body for every POST to the
app. This deployment does the gateway's routing work once: the tenant from the API key
(HAProxy forwards the client's `Authorization` as Serve's session header, which kvroute
sets to `authorization` in this mode), the prompt's token ids (chat template included) and
their Protocol 1 block hashes (router/serve/route_calls.py; a large body in a thread, off
the loop that routes everyone); then the engine deployment's own request router
(`ServeRequestRouter`, through `handle.choose_replica`) picks the replica. The answer names
the replica and adds a header (HAProxy strips client values of the `x-serve-router-`
prefix; its value is signed, router/serve/route_header.py) that tells the engine replica
which router to report the request's start and end to, so the router's outstanding load
drops when the request finishes, or soon when it never reaches the replica.

A body it cannot route (not JSON, not a completion, a bad key, a number or prompt the
replica will refuse, over the size limit) still gets a replica, by load, and charges none:
that replica's own API answers the client with the right 4xx.

"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

from ray import serve
from ray.serve.exceptions import DeploymentUnavailableError

from router.front.routing_body import off_loop
from router.front.tenants import TenantAuth, load_api_keys
from router.serve.request_router import gateway_process_id
from router.serve.route_calls import RouteCall, RouteCalls
from router.serve.route_header import ROUTE_HEADER, Route, RouteSigner
from worker.openai.prompt import PromptBuilder
from worker.process_settings import ProcessSettings
from worker.tokenizer.files import tokenizer_dir

log = logging.getLogger(__name__)

_TOKENIZER_THREADS = 2  # reading large bodies for routing (router/front/routing_body.py)
_CONTEXT_RETRY_S = 1.0  # between asks for the replicas' context limit while they start


@dataclass(frozen=True)
class IngressRouteEndpointConfig:
    model: str  # "tiny" or a checkpoint directory (tokenizer and chat template)
    served_model_name: str  # the hash namespace
    block_size: int
    # the most tokens a replica's context holds (its pool's when the model's is not known
    # here): bounds max_tokens and the prompt's text before it is tokenized
    max_model_len: int
    api_keys_file: str | None = None
    route_key: bytes = field(kw_only=True, repr=False)  # signs the route header

    def __post_init__(self):
        if self.block_size < 1:
            raise ValueError("IngressRouteEndpointConfig: block_size >= 1 required")
        if self.max_model_len < 1:
            raise ValueError("IngressRouteEndpointConfig: max_model_len >= 1 required")
        RouteSigner(self.route_key)  # raises on a short key


async def call_of(calls: RouteCalls, threads: Executor, body: bytes | None,
                  authorization: str | None) -> RouteCall | None:
    """The body's route call: read on the loop when small, else in one of `threads`."""
    if body is None:
        return None  # over the size limit: the replica answers 413
    return await off_loop(threads, len(body), lambda: calls.of(body, authorization))


async def _read_body(receive, max_bytes: int) -> bytes | None:
    """The body, or None as soon as it is larger than `max_bytes` (not read further: HAProxy
    sends at most its buffer, so only a caller that is not HAProxy gets here)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send_json(send, status: int, body: dict) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


# Serve's access log line per /internal/route call costs as much as routing it; the
# engine replica that serves the request keeps its own.
@serve.deployment(name="KVRouteIngressRouter", max_ongoing_requests=1000,
                  ray_actor_options={"num_cpus": 0},
                  logging_config={"log_level": "WARNING", "enable_access_log": False})
@serve.ingress()
class IngressRouteEndpoint:
    """HAProxy's routing endpoint, as a bare ASGI app: one small JSON call per client
    request, where FastAPI's routing, validation and response classes cost more than the
    routing itself (benchmarks/NOTEBOOK.md, "Where the time goes")."""

    async def __init__(self, engine_handle, config: IngressRouteEndpointConfig):
        self.router_id = gateway_process_id()
        prompts = PromptBuilder(tokenizer_dir(config.model), config.served_model_name,
                                config.block_size)
        process = ProcessSettings.from_environ(os.environ)  # limits, keys
        self.calls = RouteCalls(prompts,
                                TenantAuth(load_api_keys(config.api_keys_file, process)),
                                config.max_model_len, process.request_limits())
        self.signer = RouteSigner(config.route_key)
        self.engine = engine_handle
        self._tokenizers = ThreadPoolExecutor(_TOKENIZER_THREADS,
                                              thread_name_prefix="kvroute-route-call")
        self._context = asyncio.get_running_loop().create_task(self._learn_context())

    async def _learn_context(self) -> None:
        """Narrows the context bound to the replicas' own limit (the model's, when it is
        below the pool's), so a request they will refuse as too long charges nothing."""
        while True:
            try:
                info = await self.engine.replica_info.remote()
            except Exception as err:  # the engine replicas are not up yet
                log.info("no engine replica answered replica_info yet: %r", err)
                await asyncio.sleep(_CONTEXT_RETRY_S)
                continue
            self.calls.max_model_len = min(self.calls.max_model_len,
                                           int(info["max_model_len"]))
            break
        # One decision with no request behind it (no call: it charges nothing) starts the
        # request router's index mirror now, not at the first client's request, which would
        # wait for the mirror's first poll (and HAProxy, timing it out, ask another router).
        try:
            async with self.engine.choose_replica(_reserve=False):
                pass
        except (DeploymentUnavailableError, RuntimeError) as err:
            log.info("warming the request router failed: %r", err)

    def __serve_build_asgi_app__(self) -> _RouterApp:
        return _RouterApp(self)

    async def route(self, body: bytes | None, authorization: str | None) -> tuple[int, dict]:
        call = await call_of(self.calls, self._tokenizers, body, authorization)
        try:
            async with self.engine.choose_replica(*((call,) if call else ()),
                                                  _reserve=False) as selection:
                replica = selection._replica  # Serve LLM's LLMRouter reads the same fields
        except (DeploymentUnavailableError, RuntimeError) as err:
            log.warning("no engine replica to route to: %r", err)
            return 503, {"detail": "no engine replica"}
        endpoint = replica.backend_http_endpoint
        if endpoint is None:
            return 503, {"detail": f"replica {selection.replica_id} has no HTTP port"}
        headers = ({ROUTE_HEADER: self.signer.header(Route(self.router_id, call.route_id))}
                   if call else {})
        return 200, {"host": endpoint[0], "port": endpoint[1],
                     "replica_id": replica.replica_id.to_full_id_str(),
                     "request_headers": headers}


class _RouterApp:
    """The ASGI app (a class with an async __call__: uvicorn, under Serve, tells ASGI 3 from
    ASGI 2 by that)."""

    def __init__(self, router: IngressRouteEndpoint):
        self.router = router

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        path, method = scope.get("path"), scope.get("method")
        if path == "/internal/route" and method == "POST":
            authorization = None
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value.decode("latin-1")
            raw = await _read_body(receive, self.router.calls.limits.max_body_bytes)
            status, body = await self.router.route(raw, authorization)
        elif path == "/health" and method == "GET":
            status, body = 200, {"status": "ok"}
        else:
            status, body = 404, {"detail": "Not Found"}
        await _send_json(send, status, body)
