"""The front door every kvroute OpenAI server composes: what is the same on all four.

kvroute answers the OpenAI API from four processes: the engine replica's own HTTP app (the
default, ingress direct), the gateway (ingress gateway), the gateway in front of external
servers (`kvroute serve --workers`) and `kvroute engine`. Each does the same things before
its own work, here, once:

- auth: the API key to a tenant (its cache salt), through the front's `Auth` (tenants'
  keys on the router's fronts; `Anonymous` on `kvroute engine`, which has no tenants);
- limits: the body read within the size limit (worker/openai/limits.py);
- stream slots: each tenant's concurrent requests (worker/openai/stream_slots.py);
- the prompt builder (tokenizer, chat template, block hashes) and its encoder, which
  tokenizes long text off the event loop;
- the model check (404 for another model) and the context length;
- the bodies of /v1/models, /health and /ready (worker/openai/routes.py routes them).

What differs (who generates, who answers /ready and /metrics, pins, the worker admin API) is
the front's own and reaches the route table as handlers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from starlette.requests import Request

from worker.openai.errors import APIError
from worker.openai.limits import RequestLimits, read_body
from worker.openai.prompt import PromptBuilder
from worker.openai.prompt_encoder import PromptEncoder
from worker.openai.schema import ChatCompletionRequest, CompletionRequest, parse_body
from worker.openai.stream_slots import StreamSlots
from worker.process_settings import ProcessSettings

OWNED_BY = "kvroute"
T = TypeVar("T")


class Auth(Protocol):
    """API key to tenant. `tenant_of` returns the tenant ("" for the anonymous user) or
    raises APIError(401) for a missing or unknown key; `enabled` says whether keys are
    configured (then each tenant has its own stream slots)."""

    enabled: bool

    def tenant_of(self, authorization: str | None) -> str: ...


class Anonymous:
    """No API keys: every request is the anonymous tenant's ("")."""

    enabled = False

    def tenant_of(self, authorization: str | None) -> str:
        return ""


# The context length in tokens (prompt + output must fit), None while nobody behind the front
# can say (no replica or worker answered yet).
ContextLength = Callable[[], Awaitable[int | None]]


def fixed_context(max_model_len_tokens: int) -> ContextLength:
    """The context length of a front that knows it (its own engine)."""
    async def context() -> int | None:
        return max_model_len_tokens

    return context


class FrontDoor:
    """Args:
        model: the API's model name (what /v1/models lists and bodies must name).
        prompts: the model's prompt builder (tokenizer, chat template, block hashes).
        limits: the request limits (body size, prompt characters, sequences).
        auth: API key to tenant.
        streams: concurrent requests per tenant (None: no limit).
        context: the context length in tokens (prompt + output must fit), or None while
            nobody behind the front can say.
    """

    def __init__(self, model: str, prompts: PromptBuilder, limits: RequestLimits,
                 auth: Auth, streams: StreamSlots | None, context: ContextLength):
        self.model = model
        self.prompts = prompts
        self.encoder = PromptEncoder(prompts)  # long prompts off the event loop
        self.limits = limits
        self.auth = auth
        self.streams = streams
        self._context = context

    @classmethod
    def for_tenants(cls, model: str, prompts: PromptBuilder, settings: ProcessSettings,
                    auth: Auth, context: ContextLength) -> FrontDoor:
        """A router's front: the process's limits, and each tenant's stream slots when keys
        are configured."""
        return cls(model, prompts, settings.request_limits(), auth,
                   StreamSlots.for_tenants(auth.enabled, settings.max_streams_per_tenant),
                   context)

    def tenant(self, request: Request) -> str:
        """The request's tenant; APIError(401) for a bad key."""
        return self.auth.tenant_of(request.headers.get("authorization"))

    async def body(self, request: Request) -> bytes:
        """The request's body, read within the size limit (413 over it)."""
        return await read_body(request, self.limits)

    def check_model(self, model: str | None) -> None:
        """404 unless `model` is this server's (or not given)."""
        if model is not None and model != self.model:
            raise APIError(404, f"the model {model!r} does not exist; this server serves "
                                f"{self.model!r}", param="model", code="model_not_found")

    async def context(self) -> int:
        """The context length in tokens; 503 while nobody behind the front can say."""
        tokens = await self._context()
        if tokens is None:
            raise APIError(503, "the context length is not known yet: nothing behind this "
                                "server has answered", type_="service_unavailable_error",
                           code="context_unknown")
        return tokens

    async def known_context(self) -> int | None:
        """The context length in tokens, None while nobody behind the front can say."""
        return await self._context()

    async def parse(self, request: Request, model_cls: type[T]) -> T:
        """The request's body as `model_cls`: read within the size limit, its values
        counted against what a request to the known context needs before it is parsed."""
        return parse_body(await self.body(request), model_cls, self.limits,
                          await self._context())

    async def completion_request(self, request: Request,
                                 context: Callable[[], Awaitable[int]]
                                 ) -> tuple[CompletionRequest, list[list[int]]]:
        """A /v1/completions request, checked (limits, schema, model) and its prompts as
        token ids; `context` gives the context length (text that cannot fit it is refused
        before it is tokenized)."""
        body = await self.parse(request, CompletionRequest)
        self.check_model(body.model)
        return body, await self.encoder.completion(body.prompts(), await context())

    async def chat_request(self, request: Request, context: Callable[[], Awaitable[int]]
                           ) -> tuple[ChatCompletionRequest, list[int]]:
        """A /v1/chat/completions request, checked, and its messages through the chat
        template as token ids."""
        body = await self.parse(request, ChatCompletionRequest)
        self.check_model(body.model)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        return body, await self.encoder.chat(messages, await context())

    async def models_body(self) -> dict[str, Any]:
        """/v1/models: the one model, with its context length as vLLM lists it (left out
        while it is not known, so the list answers before anything behind it is up)."""
        entry: dict[str, Any] = {"id": self.model, "object": "model", "created": 0,
                                 "owned_by": OWNED_BY, "root": self.model}
        tokens = await self._context()
        if tokens is not None:
            entry["max_model_len"] = tokens
        return {"object": "list", "data": [entry]}


def ready_body(ready: bool, **details: Any) -> tuple[dict[str, Any], int]:
    """/ready's body and status: 200 when the front can serve, else 503."""
    return {"ready": ready, **details}, 200 if ready else 503
