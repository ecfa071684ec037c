"""EngineClient's retry and error mapping, against a stand-in for the Serve handle.

A replica that is shutting down at the moment a request reaches it cannot be caused on
demand in a live cluster, so the handle here replays scripted replica answers; everything
else is the production client.
"""

import asyncio
import json
import logging

import pytest
import ray
from ray.serve import context as serve_context

from protocol.engine import (
    EngineInputError,
    EngineRequest,
    EngineUnavailableError,
    SamplingParams,
    TokenDelta,
)
from router.front.engine_client import EngineClient, ReplicaLost, RetryConfig
from worker.openai.choices import Choices
from worker.openai.errors import APIError
from worker.openai.responses import ResponseShape
from worker.openai.streaming import sse_events


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


# Ray's text for a killed Serve replica, as a gateway saw it: the actor's id, name, pid and
# node IP, none of which is the client's business.
RAY_ACTOR_DIED = (
    "The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: ServeReplica:kvroute:EngineReplica\n"
    "\tactor_id: 9f1c2a3b4c5d6e7f8a9b0c1d01000000\n\tpid: 43117\n"
    "\tname: SERVE_REPLICA::kvroute#EngineReplica#x1y2z3\n\tnamespace: serve\n"
    "\tip: 10.0.3.17\nThe actor is dead because it was killed by `ray.kill`.")
INTERNALS = ("9f1c2a3b", "43117", "10.0.3.17", "SERVE_REPLICA", "EngineReplica", "x1y2z3",
             "actor")


def actor_died() -> ray.exceptions.RayActorError:
    return ray.exceptions.RayActorError("9f1c2a3b4c5d6e7f8a9b0c1d01000000", RAY_ACTOR_DIED)


class _CutStream(_Stream):
    """One delta, then the replica's death."""

    async def __anext__(self):
        if not self._outcome:
            raise actor_died()
        return self._outcome.pop(0)


def test_a_stream_cut_by_a_lost_replica_tells_the_client_no_internals(caplog):
    handle = _Handle([])
    handle.remote = lambda r: _CutStream([TokenDelta(r.request_id, [7], "x")])
    client = EngineClient(handle, RetryConfig(max_attempts=1, backoff_s=0.0))

    async def events() -> list[bytes]:
        choices = Choices([request()], 1, client.stream)
        await choices.start()
        shape = ResponseShape.new("completion", "cmpl-1", "tiny")
        return [e async for e in sse_events(shape, choices, False, None,
                                            lost_errors=(ReplicaLost,))]

    with caplog.at_level(logging.WARNING, logger="router.front.engine_client"):
        sent = b"".join(run(events())).decode()
    last = json.loads(sent.strip().split("\n\n")[-1].removeprefix("data: "))
    assert last == {"error": {
        "message": "the replica serving this request was lost mid-stream; the output so far "
                   "is all there is (retry the request)",
        "type": "service_unavailable_error", "param": None, "code": "replica_unavailable"}}
    assert [s for s in INTERNALS if s in sent] == []
    assert "pid: 43117" in caplog.text and "request req" in caplog.text  # kept, server-side


class _DeadUnary:
    """`handle.pin`: every `.remote(message)` fails as the replica died."""

    async def remote(self, message):
        raise actor_died()


@pytest.mark.parametrize("method", ["complete", "call"])
def test_no_replica_left_is_a_503_that_names_no_actor_host_or_pid(method, caplog):
    handle = _Handle([actor_died(), actor_died()])
    handle.pin = _DeadUnary()
    client = EngineClient(handle, RetryConfig(max_attempts=2, backoff_s=0.0))
    with caplog.at_level(logging.WARNING, logger="router.front.engine_client"), \
            pytest.raises(APIError) as info:
        run(client.complete(request()) if method == "complete"
            else client.call("pin", "prefix"))
    what = "request" if method == "complete" else "pin call"
    assert (info.value.status_code, info.value.code, info.value.message) == (
        503, "replica_unavailable", f"no engine replica could serve the {what} in 2 "
                                    "attempts (its replica was lost); retry it")
    assert "pid: 43117" in caplog.text
