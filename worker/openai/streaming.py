"""Token deltas to OpenAI server-sent events, for one request."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from worker.api import TokenDelta, Usage
from worker.openai.errors import APIError
from worker.openai.responses import ResponseShape, sse

DONE = sse("[DONE]")


def engine_failed(message: str | None) -> APIError:
    return APIError(500, f"the engine failed: {message}", type_="server_error",
                    code="engine_error")


async def sse_events(shape: ResponseShape, first: TokenDelta,
                     rest: AsyncGenerator[TokenDelta, None], include_usage: bool
                     ) -> AsyncIterator[bytes]:
    """One chunk per delta that carries text (the first and the last always), then the usage
    chunk when asked for, then `[DONE]`. A delta that reports an engine error ends the
    stream with an error event (no `[DONE]`): the client's SDK raises it.

    `first` was taken from the stream already (so errors before it are plain HTTP errors);
    `rest` yields the deltas after it. `rest` is closed when this ends, also early (the
    client left): closing an engine stream aborts its request.
    """
    usage: Usage | None = None
    delta: TokenDelta | None = first
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
    finally:
        await rest.aclose()
