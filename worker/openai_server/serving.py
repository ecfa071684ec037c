"""Completions and chat completions on one in-process engine.

Per request: validate the body, tokenize (chat template for chat; text that cannot fit the
context refused first, a long prompt off the event loop: worker/openai/prompt_encoder.py),
check the context, and stream the engine's deltas as OpenAI bodies or SSE. Errors before
the first token are plain HTTP errors (400 bad input, 404 unknown model, 503 shutting
down); after it, an error event ends the stream. A client that leaves aborts its engine
request: a stream when Starlette cancels it, a non-streaming request (or one still waiting
for its first token) when the disconnect arrives on the ASGI channel.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from protocol.engine import (
    EngineInputError,
    EngineRequest,
    EngineUnavailableError,
    TokenDelta,
)
from worker.engine.engine import Engine
from worker.openai.choices import Choices, OpenStream, collect
from worker.openai.engine_params import Kind, engine_requests
from worker.openai.errors import APIError, engine_input_error
from worker.openai.front import FrontDoor
from worker.openai.latency import LatencyMetrics, arrival_of
from worker.openai.logprobs import LogprobsFormatter
from worker.openai.prompt_hits import PROMPT_HITS_KEY, PromptHits, recording
from worker.openai.responses import ResponseShape
from worker.openai.schema import ChatCompletionRequest, CompletionRequest
from worker.openai.stream_slots import StreamSlot
from worker.openai.streaming import full_response, sse_events

T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left; nobody reads it


class ClientGone(Exception):
    """The client disconnected before the response started."""


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects. Only call after the body was read: the ASGI
    server then has nothing but the disconnect left to deliver."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def while_connected(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """`work()`, cancelled (its engine request aborted) if the client leaves first."""
    task = asyncio.ensure_future(work())
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        raise ClientGone()
    return task.result()


class OpenAIServing:
    """The OpenAI generation endpoints of one engine, behind a front door (its prompts,
    limits, model check and each tenant's stream slots: worker/openai/front.py)."""

    def __init__(self, engine: Engine, door: FrontDoor, latency: LatencyMetrics | None = None):
        """`latency`: where to observe each request's latency (a front that has them)."""
        self.engine = engine
        self.door = door
        self.encoder = door.encoder
        self.latency = latency
        self.limits = door.limits
        self.streams = door.streams  # 429 over a tenant's concurrent requests
        self.model = door.model
        self.logprobs = LogprobsFormatter(door.prompts.tokenizer)

    async def completions(self, request: Request, cache_salt: str = "") -> Response:
        """`cache_salt`: the tenant's hash namespace (a router in front authenticated it)."""
        body, prompts = await self.door.completion_request(request, self._context)
        return await self._generate(request, "completion", "cmpl", body, prompts,
                                    cache_salt)

    async def chat_completions(self, request: Request, cache_salt: str = "") -> Response:
        body, token_ids = await self.door.chat_request(request, self._context)
        return await self._generate(request, "chat", "chatcmpl", body, [token_ids],
                                    cache_salt)

    async def _context(self) -> int:
        return self.engine.max_model_len

    async def _generate(self, request: Request, kind: Kind, id_prefix: str,
                        body: CompletionRequest | ChatCompletionRequest,
                        prompts: list[list[int]], cache_salt: str) -> Response:
        response_id = f"{id_prefix}-{uuid.uuid4().hex}"
        requests = engine_requests(kind, response_id, body, prompts,
                                   self.engine.max_model_len, cache_salt)
        shape = ResponseShape.new(kind, response_id, self.model)
        open_stream = self.engine.generate
        if self.latency is not None:
            timer = self.latency.timer(arrival_of(request.scope))
            timer.dispatched()

            def open_stream(engine_request):  # each choice's deltas, observed
                return timer.watch(self.engine.generate(engine_request))
        hits = request.scope.get(PROMPT_HITS_KEY)
        if hits is not None:  # a router in front asks what the routed prompt found cached
            open_stream = _recording(hits, requests[:body.n], open_stream)

        choices = Choices(requests, body.n, open_stream, _refused)

        async def whole() -> dict[str, Any]:
            await choices.start()
            return full_response(shape, await collect(choices), body.n, self.logprobs)

        # every request, streamed or not: 429 + Retry-After over the tenant's limit
        slot = StreamSlot(self.streams, cache_salt)
        try:
            if not body.stream:
                return JSONResponse(await while_connected(request, whole))
            await while_connected(request, choices.start)
        except BaseException as err:
            slot.release()
            if isinstance(err, ClientGone):
                await choices.aclose()
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            raise
        finally:
            if not body.stream:
                slot.release()
        events = sse_events(shape, choices, body.include_usage(), self.logprobs)
        return StreamingResponse(slot.hold(events), media_type="text/event-stream")



def _recording(hits: PromptHits, first: list[EngineRequest], open_stream: OpenStream
               ) -> OpenStream:
    """`open_stream`, each stream's tokens counted in `hits`, and the cached tokens of the
    first prompt's (`first`)."""
    first_ids = {r.request_id for r in first}

    def open_recorded(engine_request: EngineRequest) -> AsyncGenerator[TokenDelta, None]:
        stream = open_stream(engine_request)
        return recording(hits, stream, engine_request.request_id in first_ids)

    return open_recorded


def _refused(err: Exception) -> Exception:
    """The engine's refusals of a request (raised before its first delta) as HTTP errors."""
    if isinstance(err, EngineInputError):
        return engine_input_error(err)
    if isinstance(err, EngineUnavailableError):
        return APIError(503, str(err), type_="service_unavailable_error",
                        code="engine_unavailable")
    return err
