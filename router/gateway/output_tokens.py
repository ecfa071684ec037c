"""The tokens a worker produced for a request, read from the answer the gateway relays.

The router charged the request the decode it expected, and corrects that to the work done
when the request ends (router/core/load.py). A whole JSON answer says it in
`usage.completion_tokens`. A stream says it in its usage event when the client asked for
one (`stream_options.include_usage`); otherwise each event that carries choices counts as
one token, as vLLM, SGLang and `kvroute engine` stream one token an event by default.
"""

from __future__ import annotations

import json

_DATA = b"data: "
_USAGE = b'"completion_tokens"'
_CHOICES = b'"choices"'


def completion_tokens(answer: bytes) -> int | None:
    """`usage.completion_tokens` of a JSON answer (or of one stream event's JSON); None
    when it has none, or it is not a count."""
    try:
        usage = json.loads(answer).get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    except (ValueError, AttributeError):  # not JSON, or not an object
        return None
    return tokens if type(tokens) is int and tokens >= 0 else None


class StreamTokens:
    """Counts the tokens of a relayed event stream, fed whole events as relayed."""

    def __init__(self) -> None:
        self._num_events = 0  # events with choices
        self._usage_tokens: int | None = None  # from the stream's usage event, when it has one

    def feed(self, events: bytes) -> None:
        for line in events.split(b"\n"):
            if not line.startswith(_DATA):
                continue
            if _USAGE in line:
                tokens = completion_tokens(line[len(_DATA):])
                if tokens is not None:
                    self._usage_tokens = tokens
                    continue
            if _CHOICES in line:
                self._num_events += 1

    @property
    def tokens(self) -> int:
        return self._num_events if self._usage_tokens is None else self._usage_tokens
