"""The gateway's calls to engine replicas: routed streams, retries, clear errors.

A call that fails because its replica died, is unreachable or is shutting down before
anything was streamed is retried on another replica (the request router has dropped a dead
one by then); once a delta has reached the caller it cannot be retried, and the caller gets
`ReplicaLost`. Bad input from the engine (`EngineInputError`) becomes a 400.

Ray's error (the actor's id, name, pid and node IP) goes to the log with the request's id;
the client's error says what happened in words that name no host, process or actor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import ray
from ray.serve import context as serve_context
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from protocol.engine import EngineInputError, EngineRequest, EngineUnavailableError, TokenDelta
from worker.openai.errors import APIError, engine_input_error

log = logging.getLogger(__name__)
Watch = Callable[[AsyncGenerator[TokenDelta, None]], AsyncGenerator[TokenDelta, None]]

# Errors that mean "this replica is gone, unreachable or closing", not "the request is bad".
REPLICA_ERRORS = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                  DeploymentUnavailableError, BackPressureError, EngineUnavailableError)


class ReplicaLost(Exception):
    """The replica died after the stream had started; the request cannot be retried. Its
    text is for the log (it quotes Ray's error), never for the client."""


@dataclass(frozen=True)
class RetryConfig:
    max_attempts: int = 3
    backoff_s: float = 0.2  # before attempt k (k >= 1): k * backoff_s, so Serve can notice

    def __post_init__(self):
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.backoff_s < 0:
            raise ValueError(f"backoff_s must be >= 0, got {self.backoff_s}")


def unavailable(message: str) -> APIError:
    return APIError(503, message, type_="service_unavailable_error",
                    code="replica_unavailable")


def no_replica(what: str, attempts: int, last_error: BaseException | None) -> APIError:
    """503: no replica served `what` in `attempts`, with the last error's kind in the
    client's words (kvroute's engine's own words when it said it is closing; Ray's text
    names the actor, its pid and node IP, so it is logged by the caller, never sent)."""
    if isinstance(last_error, EngineUnavailableError):
        cause = str(last_error)
    elif isinstance(last_error, BackPressureError):
        cause = "every replica's queue is full"
    elif isinstance(last_error, DeploymentUnavailableError):
        cause = "no replica of the engine is running"
    else:
        cause = "its replica was lost"
    return unavailable(f"no engine replica could serve the {what} in {attempts} attempts "
                       f"({cause}); retry it")


@contextmanager
def own_serve_request_id() -> Iterator[None]:
    """Handle calls made inside get their own Serve internal request id. Serve gives every
    call made while serving one HTTP request that request's id, and the request router keys
    its routing decisions by it: the engine calls of an n > 1 or batched request, made side
    by side, must not share one (with two replicas they hung)."""
    context = serve_context._get_serve_request_context()
    token = serve_context._serve_request_context.set(
        dataclasses.replace(context, _internal_request_id=str(uuid.uuid4())))
    try:
        yield
    finally:
        serve_context._serve_request_context.reset(token)


class EngineClient:
    """Streams engine calls through the engine deployment's handle."""

    def __init__(self, handle: Any, retry: RetryConfig | None = None):
        self._handle = handle
        self._retry = retry or RetryConfig()

    async def stream(self, request: EngineRequest) -> AsyncIterator[TokenDelta]:
        """The request's deltas. Raises APIError before the first delta (bad input, no
        replica), ReplicaLost after it. Closing the iterator cancels the engine call."""
        gen, first = await self._open(request)
        try:
            yield first
            if first.finish_reason is not None:
                return
            async for delta in gen:
                yield delta
                if delta.finish_reason is not None:
                    return
        except REPLICA_ERRORS as err:
            log.warning("request %s: its replica was lost mid-stream: %r", request.request_id,
                        err)
            raise ReplicaLost(f"the replica serving request {request.request_id} died: "
                              f"{err!r}") from None
        finally:
            gen.cancel()

    async def complete(self, request: EngineRequest, watch: Watch | None = None
                       ) -> list[TokenDelta]:
        """All of the request's deltas (non-streaming). Nothing has reached the client
        until it returns, so a replica lost mid-way is retried from the start. `watch`
        (e.g. the gateway's latency timer) wraps each attempt's stream."""
        base_id = request.request_id
        last_error: ReplicaLost | None = None
        for attempt in range(self._retry.max_attempts):
            if attempt:
                request = dataclasses.replace(request, request_id=f"{base_id}~r{attempt}")
            deltas: list[TokenDelta] = []
            stream = self.stream(request)
            if watch is not None:
                stream = watch(stream)
            try:
                async for delta in stream:
                    deltas.append(delta)
                return deltas
            except ReplicaLost as err:
                log.warning("request %s: %s; retrying from the start", request.request_id, err)
                last_error = err
            finally:
                await stream.aclose()
        log.warning("request %s: every replica serving it died, the last: %s", base_id,
                    last_error)
        raise unavailable(f"every replica serving the request was lost "
                          f"({self._retry.max_attempts} attempts); retry it")

    async def _open(self, request: EngineRequest) -> tuple[Any, TokenDelta]:
        last_error: BaseException | None = None
        base_id = request.request_id
        for attempt in range(self._retry.max_attempts):
            if attempt:  # a fresh id: the engine refuses duplicates
                await asyncio.sleep(attempt * self._retry.backoff_s)
                request = dataclasses.replace(request, request_id=f"{base_id}~{attempt}")
            with own_serve_request_id():
                gen = self._handle.generate.options(stream=True).remote(request)
            try:
                return gen, await gen.__anext__()
            except EngineInputError as err:
                gen.cancel()
                raise engine_input_error(err) from None
            except REPLICA_ERRORS as err:
                gen.cancel()
                last_error = err
                log.warning("request %s: replica failed before streaming (%r); retrying",
                            request.request_id, err)
            except StopAsyncIteration:
                last_error = RuntimeError("the engine ended the stream without a result")
            except BaseException:
                gen.cancel()
                raise
        log.warning("request %s: no engine replica could serve it after %d attempts, the "
                    "last: %r", base_id, self._retry.max_attempts, last_error)
        raise no_replica("request", self._retry.max_attempts, last_error)

    async def call(self, method: str, message: Any) -> Any:
        """A unary engine call (pin / unpin) with the same retry and error mapping."""
        last_error: BaseException | None = None
        for attempt in range(self._retry.max_attempts):
            if attempt:
                await asyncio.sleep(attempt * self._retry.backoff_s)
            try:
                return await getattr(self._handle, method).remote(message)
            except EngineInputError as err:
                raise engine_input_error(err) from None
            except REPLICA_ERRORS as err:
                last_error = err
        log.warning("%s: no engine replica could serve it after %d attempts, the last: %r",
                    method, self._retry.max_attempts, last_error)
        raise no_replica(f"{method} call", self._retry.max_attempts, last_error)
