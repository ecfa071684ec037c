"""The prompt tokens a request found cached, for the router in front of this server.

A middleware that wants the count (router/serve/route_tracking.py: the router that routed
the request compares it with what it predicted) puts a `PromptHits` in the request's ASGI
scope under `PROMPT_HITS_KEY`; the serving layer fills it as the request's engine requests
end. It counts the first prompt (a batch is routed on its first) and, of its n choices, the
one that hit least: the hits that were there before the request (its other choices hit what
that one computed), as `usage.prompt_tokens_details.cached_tokens` counts them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from protocol.engine import TokenDelta

PROMPT_HITS_KEY = "kvroute.prompt_hits"


class PromptHits:
    __slots__ = ("cached_tokens",)

    def __init__(self) -> None:
        self.cached_tokens: int | None = None  # None until a choice of the prompt ended

    def observe(self, cached_tokens: int) -> None:
        if self.cached_tokens is None or cached_tokens < self.cached_tokens:
            self.cached_tokens = cached_tokens


async def recording(hits: PromptHits, deltas: AsyncGenerator[TokenDelta, None]
                    ) -> AsyncGenerator[TokenDelta, None]:
    """`deltas`, the cached tokens of their usage (on the last one) put in `hits`. Closing
    the result closes `deltas`."""
    try:
        async for delta in deltas:
            if delta.usage is not None:
                hits.observe(delta.usage.cached_tokens)
            yield delta
    finally:
        await deltas.aclose()
