"""A response's choices as OpenAI bodies: whole, or as server-sent events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from protocol.engine import TokenDelta, Usage
from worker.openai.choices import ChoiceOutput, Choices, total_usage
from worker.openai.errors import APIError
from worker.openai.logprobs import LogprobsFormatter
from worker.openai.responses import ResponseShape, sse

DONE = sse("[DONE]")


def engine_failed(message: str | None) -> APIError:
    return APIError(500, f"the engine failed: {message}", type_="server_error",
                    code="engine_error")


def lost() -> APIError:
    """A stream cut by its replica's loss, in words that name no host, process or actor (the
    error itself, Ray's text, is logged where it was caught)."""
    return APIError(503, "the replica serving this request was lost mid-stream; the output "
                         "so far is all there is (retry the request)",
                    type_="service_unavailable_error", code="replica_unavailable")


def full_response(shape: ResponseShape, outputs: list[ChoiceOutput], n: int,
                  formatter: LogprobsFormatter) -> dict[str, Any]:
    """The whole response; APIError(500) when the engine failed a choice."""
    for out in outputs:
        if out.finish_reason == "error":
            raise engine_failed(out.error)
    choices = []
    for index, out in enumerate(outputs):
        logprobs = None
        if out.logprobs is not None:
            logprobs = (formatter.completion(out.logprobs)[0] if shape.kind == "completion"
                        else formatter.chat(out.logprobs))
        choices.append(shape.choice(out.text, out.finish_reason, index, logprobs))
    return shape.full(choices, total_usage([out.usage for out in outputs], n))


def sse_events(shape: ResponseShape, choices: Choices, include_usage: bool,
               formatter: LogprobsFormatter,
               lost_errors: tuple[type[BaseException], ...] = ()) -> AsyncIterator[bytes]:
    """The started `choices` as SSE: one chunk per delta that carries text or logprobs
    (each choice's first and last always), then the usage chunk when asked for, then
    `[DONE]`. An engine error (a delta that reports one, or one of `lost_errors` after the
    stream started) ends the stream with an error event and no `[DONE]`: the client's SDK
    raises it. Every engine stream is closed when this ends, also early (the client left):
    closing one aborts its request."""
    if len(choices) == 1 and choices.requests[0].sampling.logprobs is None:
        return _one_choice(shape, choices, include_usage, lost_errors)
    return _many_choices(shape, choices, include_usage, formatter, lost_errors)


async def _one_choice(shape: ResponseShape, choices: Choices, include_usage: bool,
                      lost_errors: tuple[type[BaseException], ...]) -> AsyncIterator[bytes]:
    """The common case, kept cheap: per delta only its text is escaped (`text_event`)."""
    usage: Usage | None = None
    delta: TokenDelta | None = choices.firsts[0]
    rest = choices.streams[0]
    is_first = True
    try:
        while delta is not None:
            if delta.finish_reason == "error":
                yield sse(engine_failed(delta.error).body())
                return
            if delta.finish_reason is not None or is_first:
                yield sse(shape.chunk(delta.text, delta.finish_reason, first=is_first))
            elif delta.text:
                yield shape.text_event(delta.text)  # the per-delta path: bytes only
            is_first = False
            if delta.finish_reason is not None:
                usage = delta.usage
                break
            delta = await anext(rest, None)
        if include_usage:
            yield sse(shape.usage_chunk(usage))
        yield DONE
    except lost_errors:
        yield sse(lost().body())
    finally:
        await choices.aclose()


async def _many_choices(shape: ResponseShape, choices: Choices, include_usage: bool,
                        formatter: LogprobsFormatter,
                        lost_errors: tuple[type[BaseException], ...]) -> AsyncIterator[bytes]:
    """Chunks of every choice as their deltas arrive, each with its choice's index."""
    queue: asyncio.Queue[tuple[int, TokenDelta | None, BaseException | None]] = (
        asyncio.Queue())
    pumps = [asyncio.ensure_future(_pump(choices, i, queue)) for i in range(len(choices))]
    usages: list[Usage | None] = [None] * len(choices)
    text_offsets = [0] * len(choices)
    started = [False] * len(choices)
    num_open = len(choices)
    try:
        while num_open:
            index, delta, error = await queue.get()
            if error is not None:
                if isinstance(error, lost_errors):
                    yield sse(lost().body())
                    return
                raise error
            if delta.finish_reason == "error":
                yield sse(engine_failed(delta.error).body())
                return
            logprobs = None
            if delta.logprobs is not None:
                if shape.kind == "completion":
                    logprobs, text_offsets[index] = formatter.completion(
                        delta.logprobs, text_offsets[index])
                else:
                    logprobs = formatter.chat(delta.logprobs)
            if delta.text or logprobs or delta.finish_reason is not None or not started[index]:
                yield sse(shape.chunk(delta.text, delta.finish_reason, not started[index],
                                      index, logprobs))
            started[index] = True
            if delta.finish_reason is not None:
                usages[index] = delta.usage
                num_open -= 1
        if include_usage:
            yield sse(shape.usage_chunk(total_usage(usages, choices.n)))
        yield DONE
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        await choices.aclose()


async def _pump(choices: Choices, i: int, queue: asyncio.Queue) -> None:
    """Choice i's deltas into `queue` as (i, delta, None), up to its last; an error as
    (i, None, error)."""
    delta = choices.firsts[i]
    stream: AsyncGenerator[TokenDelta, None] = choices.streams[i]
    try:
        while True:
            queue.put_nowait((i, delta, None))
            if delta.finish_reason is not None:
                return
            delta = await anext(stream)
    except StopAsyncIteration:
        queue.put_nowait((i, None, RuntimeError("the engine ended a stream without a "
                                                "finish reason")))
    except Exception as err:  # noqa: BLE001 - handed to the consumer, which decides
        queue.put_nowait((i, None, err))
