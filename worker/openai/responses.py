"""OpenAI response bodies and SSE chunks for completions and chat completions.

`usage.prompt_tokens_details.cached_tokens` is what OpenAI reports: prompt tokens served
from the prefix cache (here device hits plus host-tier hits copied back).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any, Literal

from protocol.engine import Usage

Kind = Literal["completion", "chat"]


def usage_body(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def finish_reason(engine_reason: str | None) -> str | None:
    """Engine reasons as OpenAI names them ("abort" ends a stream the client left)."""
    return None if engine_reason is None else {"abort": "stop"}.get(engine_reason,
                                                                   engine_reason)


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


@dataclass(frozen=True)
class ResponseShape:
    """Builds bodies for one request: its id, kind, model and creation time."""

    kind: Kind
    response_id: str
    model: str
    created: int
    # The SSE bytes of a middle chunk around its text (see `text_event`), built once
    _text_event_parts: tuple[bytes, bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        placeholder = "\x00text\x00"
        encoded = sse(self.chunk(placeholder))
        prefix, _, suffix = encoded.partition(encode_basestring_ascii(placeholder).encode())
        object.__setattr__(self, "_text_event_parts", (prefix, suffix))

    def text_event(self, text: str) -> bytes:
        """`sse(self.chunk(text))` for a chunk that is neither the first nor the last, built
        from bytes made once per request: per delta, only the text is escaped."""
        if not text:  # a chat chunk without text has no "content" at all
            return sse(self.chunk(text))
        prefix, suffix = self._text_event_parts
        return prefix + encode_basestring_ascii(text).encode() + suffix

    @classmethod
    def new(cls, kind: Kind, response_id: str, model: str) -> ResponseShape:
        return cls(kind, response_id, model, int(time.time()))

    def _head(self, chunk: bool) -> dict[str, Any]:
        if self.kind == "completion":
            obj = "text_completion"
        else:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.response_id, "object": obj, "created": self.created,
                "model": self.model}

    def full(self, choices: list[dict[str, Any]], usage: Usage | None) -> dict[str, Any]:
        """The whole response; `choices` from `choice`, in index order."""
        return {**self._head(False), "choices": choices, "usage": usage_body(usage)}

    def choice(self, text: str, reason: str | None, index: int = 0,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """One choice of a whole response."""
        if self.kind == "completion":
            return {"index": index, "text": text, "logprobs": logprobs,
                    "finish_reason": finish_reason(reason)}
        return {"index": index, "message": {"role": "assistant", "content": text},
                "logprobs": logprobs, "finish_reason": finish_reason(reason)}

    def chunk(self, text: str, reason: str | None = None, first: bool = False,
              index: int = 0, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """A streamed chunk of choice `index` (`first`: its first, which carries the role
        in chat)."""
        if self.kind == "completion":
            choice = {"index": index, "text": text, "logprobs": logprobs,
                      "finish_reason": finish_reason(reason)}
        else:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text or first:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": logprobs,
                      "finish_reason": finish_reason(reason)}
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, usage: Usage | None) -> dict[str, Any]:
        return {**self._head(True), "choices": [], "usage": usage_body(usage)}
