"""EngineClient's retry and error mapping, against a stand-in for the Serve handle.

A replica that is shutting down at the moment a request reaches it cannot be caused on
demand in a live cluster, so the handle here replays scripted replica answers; everything
else is the production client.
"""

import asyncio

import pytest
from ray.serve import context as serve_context

from protocol.engine import (
    EngineInputError,
    EngineRequest,
    EngineUnavailableError,
    SamplingParams,
    TokenDelta,
)
from router.front.engine_client import EngineClient, RetryConfig
from worker.openai.errors import APIError


class _Stream:
    def __init__(self, outcome):
        self._outcome = outcome
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        if not self._outcome:
            raise StopAsyncIteration
        return self._outcome.pop(0)

    def cancel(self):
        self.cancelled = True


class _Handle:
    """Each `generate` call takes the next scripted outcome: an exception or deltas."""

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.request_ids: list[str] = []
        self.serve_ids: list[str] = []  # the Serve internal request id of each call
        self.generate = self

    def options(self, stream):
        assert stream is True
        return self

    def remote(self, request):
        self.request_ids.append(request.request_id)
        self.serve_ids.append(serve_context._get_serve_request_context()._internal_request_id)
        return _Stream(self.outcomes.pop(0))


def request() -> EngineRequest:
    return EngineRequest("req", [1, 2, 3], SamplingParams(max_tokens=1))


def done() -> list[TokenDelta]:
    return [TokenDelta("req", [7], "x", finish_reason="length")]


def run(coro):
    return asyncio.run(coro)


def test_calls_made_while_serving_one_request_get_their_own_serve_request_ids():
    handle = _Handle([done(), done(), done()])
    client = EngineClient(handle, RetryConfig(max_attempts=1, backoff_s=0.0))

    async def one_http_request():
        serve_context._set_request_context(_internal_request_id="the-http-request")
        await asyncio.gather(*(client.complete(request()) for _ in range(3)))
        return serve_context._get_serve_request_context()._internal_request_id

    assert run(one_http_request()) == "the-http-request"  # the caller's is left as it was
    assert len(set(handle.serve_ids)) == 3 and "the-http-request" not in handle.serve_ids


def test_a_replica_shutting_down_is_retried_on_another_with_a_fresh_id():
    handle = _Handle([EngineUnavailableError("the engine is shutting down"), done()])
    client = EngineClient(handle, RetryConfig(max_attempts=3, backoff_s=0.0))
    deltas = run(client.complete(request()))
    assert [d.token_ids for d in deltas] == [[7]]
    assert handle.request_ids == ["req", "req~1"]


def test_every_replica_shutting_down_is_a_503_naming_the_cause():
    handle = _Handle([EngineUnavailableError("the engine is shutting down")] * 2)
    client = EngineClient(handle, RetryConfig(max_attempts=2, backoff_s=0.0))
    with pytest.raises(APIError) as info:
        run(client.complete(request()))
    assert info.value.status_code == 503
    assert "shutting down" in info.value.message


def test_bad_input_is_a_400_and_is_not_retried():
    handle = _Handle([EngineInputError("prompt of 9000 tokens exceeds the context"), done()])
    client = EngineClient(handle, RetryConfig(max_attempts=3, backoff_s=0.0))
    with pytest.raises(APIError) as info:
        run(client.complete(request()))
    assert info.value.status_code == 400
    assert handle.request_ids == ["req"]
