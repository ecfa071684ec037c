"""One request's output on its way from the engine's step loop to whoever streams it.

The step loop `put`s what each step produced for the request; the consumer `take`s all of
it that arrived since its last take, as one `TokenDelta`. A consumer that keeps up gets one
delta per step; one that falls behind (a slow client, a busy event loop, a full Ray stream)
gets the steps it missed merged into one delta, so what costs per delta downstream (a Ray
item, an SSE event, the objects that build them) is paid per delta, not per token. The step
loop wakes a waiting consumer at most once per step and never wakes one that has not taken
the last wake-up yet: `put` sets the event only when it is clear.
"""

from __future__ import annotations

import asyncio

from protocol.engine import TokenDelta, TokenLogprobs, Usage


class RequestOutput:
    __slots__ = ("request_id", "_token_ids", "_texts", "_finish_reason", "_usage", "_error",
                 "_logprobs", "_ready", "first_token_compute_s")

    def __init__(self, request_id: str):
        self.request_id = request_id
        self._token_ids: list[int] = []
        self._texts: list[str] = []
        self._finish_reason: str | None = None
        self._usage: Usage | None = None
        self._error: str | None = None
        self._logprobs: list[TokenLogprobs] | None = None
        self._ready = asyncio.Event()
        # Set by the step loop at the first token; goes out with the next delta, then None.
        self.first_token_compute_s: float | None = None

    @property
    def finished(self) -> bool:
        """True once the last output (with its finish reason) was put."""
        return self._finish_reason is not None

    def put(self, token_id: int | None, text: str, finish_reason: str | None = None,
            usage: Usage | None = None, error: str | None = None,
            logprobs: TokenLogprobs | None = None) -> None:
        """Appends a step's output: its token (None: none, e.g. an abort) and the text it
        completed; the one with `finish_reason` is the last (later puts raise: the request
        is over)."""
        if self._finish_reason is not None:
            raise RuntimeError(f"request {self.request_id} already finished "
                               f"({self._finish_reason}); nothing may follow")
        if token_id is not None:
            self._token_ids.append(token_id)
            if logprobs is not None:
                if self._logprobs is None:
                    self._logprobs = []
                self._logprobs.append(logprobs)
        if text:
            self._texts.append(text)
        if finish_reason is not None:
            self._finish_reason, self._usage, self._error = finish_reason, usage, error
        if not self._ready.is_set():
            self._ready.set()

    def take_nowait(self) -> TokenDelta | None:
        """Everything put since the last take, as one delta; None when nothing was."""
        if not self._ready.is_set():
            return None
        self._ready.clear()
        texts = self._texts
        text = texts[0] if len(texts) == 1 else "".join(texts)
        delta = TokenDelta(self.request_id, self._token_ids, text, self._finish_reason,
                           self._usage, self._error, self._logprobs,
                           self.first_token_compute_s)
        self._token_ids, self._texts, self._logprobs = [], [], None
        self.first_token_compute_s = None
        return delta

    async def take(self) -> TokenDelta:
        """Waits for output, then takes all of it."""
        while not self._ready.is_set():
            await self._ready.wait()
        delta = self.take_nowait()
        assert delta is not None  # the event was set and only this consumer clears it
        return delta
