"""What a worker's answer says of a request, read from the answer the gateway relays: the
tokens it produced, and the prompt tokens it served from cache.

The router charged the request the decode it expected, and corrects that to the work done
when the request ends (router/core/load.py). A whole JSON answer says it in
`usage.completion_tokens`. A stream says it in its usage event when the client asked for
one (`stream_options.include_usage`); otherwise each event that carries choices counts as
one token, as vLLM, SGLang and `kvroute engine` stream one token an event by default.

The cached prompt tokens (`usage.prompt_tokens_details.cached_tokens`: `kvroute engine`
always, vLLM with `--enable-prompt-tokens-details`) close the request's miss causes
(router/core/miss_causes.py); they come with `usage.prompt_tokens`, so the gateway can
check they are of the prompt it routed. A stream without a usage event says neither.
"""

from __future__ import annotations

import json
from typing import NamedTuple

_DATA = b"data: "
_USAGE = b'"completion_tokens"'
_CHOICES = b'"choices"'


class AnswerUsage(NamedTuple):
    """The counts an answer's `usage` holds; each None when absent or not a count."""

    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # of prompt_tokens, served from cache


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def answer_usage(answer: bytes) -> AnswerUsage:
    """The usage of a JSON answer (or of one stream event's JSON)."""
    try:
        usage = json.loads(answer).get("usage")
    except (ValueError, AttributeError):  # not JSON, or not an object
        return AnswerUsage()
    if not isinstance(usage, dict):
        return AnswerUsage()
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return AnswerUsage(_count(usage.get("completion_tokens")),
                       _count(usage.get("prompt_tokens")), _count(cached))


def completion_tokens(answer: bytes) -> int | None:
    """`usage.completion_tokens` of a JSON answer (or of one stream event's JSON); None
    when it has none, or it is not a count."""
    return answer_usage(answer).completion_tokens


class StreamTokens:
    """Counts the tokens of a relayed event stream, fed whole events as relayed."""

    def __init__(self) -> None:
        self._num_events = 0  # events with choices
        self.usage = AnswerUsage()  # from the stream's usage event, when it has one

    def feed(self, events: bytes) -> None:
        for line in events.split(b"\n"):
            if not line.startswith(_DATA):
                continue
            if _USAGE in line:
                usage = answer_usage(line[len(_DATA):])
                if usage.completion_tokens is not None:
                    self.usage = usage
                    continue
            if _CHOICES in line:
                self._num_events += 1

    @property
    def tokens(self) -> int:
        usage_tokens = self.usage.completion_tokens
        return self._num_events if usage_tokens is None else usage_tokens
