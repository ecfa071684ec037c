"""The engine requests of one OpenAI request's choices: started together, collected whole.

A request with n choices per prompt (and a batch of prompts) is n x prompts engine
requests, all started at once. A prompt's copies compute it once: the engine's scheduler
holds a request whose prefix another running request is computing until those blocks are
cached (worker/engine/scheduler.py), so the copies hit them and compute only their last partial
block (their usage shows the cached tokens). benchmarks/bench_choices.py measures it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from protocol.engine import EngineRequest, TokenDelta, TokenLogprobs, Usage

# A fresh stream of one engine request's deltas; its first `anext` raises (an APIError)
# when the request is refused.
OpenStream = Callable[[EngineRequest], AsyncGenerator[TokenDelta, None]]


class Choices:
    """The engine streams of one response's choices, in choice order."""

    def __init__(self, requests: list[EngineRequest], n: int, open_stream: OpenStream,
                 refused: Callable[[Exception], Exception] | None = None):
        """`refused`: what to raise for an error of a stream's first `anext` (the engine
        refusing the request), when it is not to be raised as is."""
        self.requests = requests
        self.n = n
        self._open_stream = open_stream
        self._refused = refused
        self.streams: list[AsyncGenerator[TokenDelta, None] | None] = [None] * len(requests)
        self.firsts: list[TokenDelta | None] = [None] * len(requests)

    def __len__(self) -> int:
        return len(self.requests)

    async def start(self) -> None:
        """Opens every choice's stream and takes its first delta. The first error (a
        refused request, no replica) closes every stream opened and is raised."""
        try:
            await all_or_first_error([self._open(i) for i in range(len(self.requests))])
        except BaseException:
            await self.aclose()
            raise

    async def _open(self, i: int) -> None:
        stream = self.streams[i] = self._open_stream(self.requests[i])
        try:
            self.firsts[i] = await anext(stream)
        except Exception as err:
            if self._refused is None:
                raise
            raise self._refused(err) from None

    async def aclose(self) -> None:
        """Closes every stream (an unfinished engine request is aborted)."""
        for stream in self.streams:
            if stream is not None:
                await stream.aclose()


@dataclass
class ChoiceOutput:
    """One choice's whole output."""

    text: str
    finish_reason: str | None
    usage: Usage | None
    logprobs: list[TokenLogprobs] | None
    error: str | None


async def collect(choices: Choices) -> list[ChoiceOutput]:
    """Every choice's output (the choices must be started); the streams are closed."""
    try:
        return await all_or_first_error([_collect_one(choices, i)
                                         for i in range(len(choices))])
    finally:
        await choices.aclose()


async def _collect_one(choices: Choices, i: int) -> ChoiceOutput:
    last = choices.firsts[i]
    assert last is not None, "collect() needs started choices"
    texts, logprobs = [last.text], list(last.logprobs or ())
    stream = choices.streams[i]
    while last.finish_reason is None:
        last = await anext(stream)
        texts.append(last.text)
        logprobs.extend(last.logprobs or ())
    asked = choices.requests[i].sampling.logprobs is not None
    return ChoiceOutput("".join(texts), last.finish_reason, last.usage,
                        logprobs if asked else None, last.error)


def total_usage(usages: list[Usage | None], n: int) -> Usage | None:
    """The usage of a response: each prompt's tokens once, as OpenAI bills n choices, with
    the cached tokens of its choice that hit the least (the hits that were there before
    this request: its other choices hit what that one computed); the completion tokens of
    every choice."""
    if any(u is None for u in usages):
        return None
    prompts = [min(usages[p:p + n], key=lambda u: u.cached_tokens)
               for p in range(0, len(usages), n)]
    return Usage(sum(u.prompt_tokens for u in prompts),
                 sum(u.completion_tokens for u in usages),
                 sum(u.cached_tokens_device for u in prompts),
                 sum(u.cached_tokens_host for u in prompts))


async def all_or_first_error(coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """The coroutines' results in order; on the first error the others are cancelled and
    it is raised (asyncio.gather would leave them running)."""
    if len(coros) <= 1:
        return [await c for c in coros]
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def replay(complete: Callable[[EngineRequest], Awaitable[list[TokenDelta]]],
                 request: EngineRequest) -> AsyncGenerator[TokenDelta, None]:
    """The deltas of `complete(request)`, a call that returns them whole (a non-streaming
    call, retried from the start when its replica is lost), as a stream."""
    for delta in await complete(request):
        yield delta
