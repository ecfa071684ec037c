"""The prompt tokens a request found cached, for the router in front of this server.

A middleware that wants the count (router/serve/route_tracking.py: the router that routed
the request compares it with what it predicted) puts a `PromptHits` in the request's ASGI
scope under `PROMPT_HITS_KEY`; the serving layer fills it as the request's engine requests
end. It counts the first prompt (a batch is routed on its first) and, of its n choices, the
one that hit least: the hits that were there before the request (its other choices hit what
that one computed), as `usage.prompt_tokens_details.cached_tokens` counts them. It also
counts the tokens every engine request of it produced, as they stream (a request its client
left counts what it made until then): the router charged it the decode it expected, and
corrects that to the work done (router/core/load.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from protocol.engine import TokenDelta

PROMPT_HITS_KEY = "kvroute.prompt_hits"


class PromptHits:
    __slots__ = ("cached_tokens", "output_tokens")

    def __init__(self) -> None:
        self.cached_tokens: int | None = None  # None until a choice of the prompt ended
        # produced so far, by every prompt and choice; None until an engine request streams
        self.output_tokens: int | None = None

    def observe(self, cached_tokens: int) -> None:
        if self.cached_tokens is None or cached_tokens < self.cached_tokens:
            self.cached_tokens = cached_tokens


async def recording(hits: PromptHits, deltas: AsyncGenerator[TokenDelta, None],
                    first_prompt: bool = True) -> AsyncGenerator[TokenDelta, None]:
    """`deltas`, their tokens counted in `hits` and, of the first prompt's, the cached
    tokens of their usage (on the last one). Closing the result closes `deltas`."""
    if hits.output_tokens is None:
        hits.output_tokens = 0
    try:
        async for delta in deltas:
            hits.output_tokens += len(delta.token_ids)
            if first_prompt and delta.usage is not None:
                hits.observe(delta.usage.cached_tokens)
            yield delta
    finally:
        await deltas.aclose()
