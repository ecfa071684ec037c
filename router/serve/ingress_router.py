"""Direct streaming's routing step: HAProxy asks this deployment which engine replica serves
a request, then sends the request straight to that replica's own HTTP port.

HAProxy (Ray Serve's HAProxy ingress with an ingress request router, as Serve LLM's direct
streaming uses it) calls `POST /internal/route` with the client's body for every POST to the
app. This deployment does the gateway's routing work once: the tenant from the API key
(HAProxy forwards the client's `Authorization` as Serve's session header, which kvroute
sets to `authorization` in this mode), the prompt's token ids (chat template included) and
their Protocol 1 block hashes; then the engine deployment's own request router
(`KVRouteRequestRouter`, through `handle.choose_replica`) picks the replica. The answer names
the replica and adds a trusted header (HAProxy strips client values of the `x-serve-router-`
prefix) that tells the engine replica which router to report the request's end to, so the
router's outstanding load drops when the request finishes.

A body it cannot route (not JSON, not a completion, a bad key) still gets a replica, by load:
that replica's own API answers the client with the right 4xx.

"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

from ray import serve
from ray.serve.exceptions import DeploymentUnavailableError

from router.gateway.tenants import TenantAuth, load_api_keys
from router.serve.request_router import gateway_process_id
from worker.openai.engine_params import max_new_tokens
from worker.openai.errors import APIError
from worker.openai.limits import RequestLimits, check_body_size, check_json_depth
from worker.openai.prompt import PromptBuilder, PromptError
from worker.openai.schema import (
    DEFAULT_MAX_TOKENS,
    ChatCompletionRequest,
    parse_body,
)
from worker.tokenizer_files import tokenizer_dir

log = logging.getLogger(__name__)

ROUTE_HEADER = "x-serve-router-kvroute-route"  # "<router id> <route id>"
ROUTED_BY_HEADER = "x-kvroute-router"  # on the response: the router id of ROUTE_HEADER


@dataclass(frozen=True)
class RouteCall:
    """What `KVRouteRequestRouter.choose_replicas` reads to route a direct request (the
    same fields as an `EngineRequest`, plus the id its end is reported under)."""

    route_id: str
    prompt_token_ids: list[int]
    block_hashes: list[bytes]
    max_tokens: int


@dataclass(frozen=True)
class IngressRouterConfig:
    model: str  # "tiny" or a checkpoint directory (tokenizer and chat template)
    served_model_name: str  # the hash namespace
    block_size: int
    api_keys_file: str | None = None

    def __post_init__(self):
        if self.block_size < 1:
            raise ValueError("IngressRouterConfig: block_size >= 1 required")


class RouteCalls:
    """Client bodies to `RouteCall`s (None when the body cannot be routed by its prompt)."""

    def __init__(self, prompts: PromptBuilder, auth: TenantAuth,
                 limits: RequestLimits | None = None):
        self.prompts = prompts
        self.auth = auth
        self.limits = RequestLimits.from_env() if limits is None else limits

    def of(self, body: bytes, authorization: str | None) -> RouteCall | None:
        try:
            tenant = self.auth.tenant_of(authorization)
            check_body_size(len(body), self.limits)
            check_json_depth(body, self.limits)
            data = json.loads(body)
            if not isinstance(data, dict):
                return None
            if "messages" in data:
                chat = parse_body(body, ChatCompletionRequest, self.limits)
                token_ids = self.prompts.encode_chat(
                    [{"role": m.role, "content": m.text()} for m in chat.messages])
                max_tokens = max_new_tokens(chat) * chat.n  # its choices' output
            else:
                # The prompt and max_tokens only, read as the schema reads them (no full
                # validation: the replica validates the body and answers a bad one).
                prompt, max_tokens = data.get("prompt"), data.get("max_tokens")
                n, num_prompts = data.get("n", 1), 1
                if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
                    num_prompts = len(prompt)
                    prompt = prompt[0]  # a batch is routed on its first prompt
                if isinstance(prompt, str) and prompt:
                    token_ids = self.prompts.encode_text(prompt)
                elif isinstance(prompt, list) and prompt and all(
                        type(t) is int for t in prompt):
                    token_ids = prompt
                else:
                    return None
                if max_tokens is None:
                    max_tokens = DEFAULT_MAX_TOKENS
                elif type(max_tokens) is not int or max_tokens < 1:
                    return None
                if type(n) is not int or n < 1:
                    return None
                max_tokens *= n * num_prompts  # the output of all its choices: its load
        except (APIError, PromptError, ValueError, RecursionError):
            return None  # the replica's API answers the client with the 4xx
        if not token_ids:
            return None
        return RouteCall(uuid.uuid4().hex, token_ids,
                         self.prompts.block_hashes(token_ids, tenant), max_tokens)


async def _read_body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left
            return b""
        chunks.append(message.get("body", b""))
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
class IngressRouter:
    """HAProxy's routing endpoint, as a bare ASGI app: one small JSON call per client
    request, where FastAPI's routing, validation and response classes cost more than the
    routing itself (benchmarks/RESULTS.md, "Serving overhead")."""

    def __init__(self, engine_handle, config: IngressRouterConfig):
        self.router_id = gateway_process_id()
        prompts = PromptBuilder(tokenizer_dir(config.model), config.served_model_name,
                                config.block_size)
        self.calls = RouteCalls(prompts, TenantAuth(load_api_keys(config.api_keys_file)))
        self.engine = engine_handle

    def __serve_build_asgi_app__(self) -> _RouterApp:
        return _RouterApp(self)

    async def route(self, body: bytes, authorization: str | None) -> tuple[int, dict]:
        call = self.calls.of(body, authorization)
        try:
            async with self.engine.choose_replica(*((call,) if call else ()),
                                                  _reserve=False) as selection:
                replica = selection._replica  # Serve LLM's LLMRouter reads the same fields
        except (DeploymentUnavailableError, RuntimeError) as err:
            return 503, {"detail": f"no engine replica: {err}"}
        endpoint = replica.backend_http_endpoint
        if endpoint is None:
            return 503, {"detail": f"replica {selection.replica_id} has no HTTP port"}
        headers = {ROUTE_HEADER: f"{self.router_id} {call.route_id}"} if call else {}
        return 200, {"host": endpoint[0], "port": endpoint[1],
                     "replica_id": replica.replica_id.to_full_id_str(),
                     "request_headers": headers}


class _RouterApp:
    """The ASGI app (a class with an async __call__: uvicorn, under Serve, tells ASGI 3 from
    ASGI 2 by that)."""

    def __init__(self, router: IngressRouter):
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
            status, body = await self.router.route(await _read_body(receive), authorization)
        elif path == "/health" and method == "GET":
            status, body = 200, {"status": "ok"}
        else:
            status, body = 404, {"detail": "Not Found"}
        await _send_json(send, status, body)
