"""OpenAIServing's per-tenant request limit (the direct-ingress engine replica and, when
KVROUTE_MAX_STREAMS_PER_TENANT is set, `kvroute engine`): a request over the tenant's limit,
streamed or not, is a 429 with Retry-After before any engine work; the slot comes back
however the request ends; other tenants are not counted."""

import asyncio
import json

import pytest
from starlette.requests import Request

from worker.engine.config import EngineConfig
from worker.engine.factory import build_engine
from worker.openai.errors import APIError
from worker.openai.front import Anonymous, FrontDoor, fixed_context
from worker.openai.limits import RequestLimits
from worker.openai.prompt import PromptBuilder
from worker.openai.stream_slots import StreamSlots, TooManyStreams
from worker.openai_server.serving import OpenAIServing
from worker.tokenizer.files import tokenizer_dir


def completion_request(stream: bool, max_tokens: int = 4, **fields) -> Request:
    body = json.dumps({"model": "tiny", "prompt": "Stream to me.", "max_tokens": max_tokens,
                       "ignore_eos": True, "stream": stream, **fields}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [],
             "query_string": b""}
    return Request(scope, receive)


@pytest.fixture
async def serving():
    engine = build_engine(EngineConfig(model="tiny", engine="sim", sim_preset="tiny",
                                       num_blocks=64, block_size=16))
    door = FrontDoor("tiny", PromptBuilder(tokenizer_dir("tiny"), "tiny", 16),
                     RequestLimits(), Anonymous(), StreamSlots(1),
                     fixed_context(engine.max_model_len))
    yield OpenAIServing(engine, door)
    await engine.shutdown()


async def test_a_tenants_second_stream_is_refused_until_its_first_ends(serving):
    first = await serving.completions(completion_request(stream=True), "tenant-a")
    assert first.status_code == 200 and serving.streams.num_open("tenant-a") == 1
    with pytest.raises(TooManyStreams) as refused:
        await serving.completions(completion_request(stream=True), "tenant-a")
    assert refused.value.status_code == 429 and refused.value.headers == {"Retry-After": "1"}
    assert serving.engine.stats().num_running + serving.engine.stats().num_waiting <= 1
    other = await serving.completions(completion_request(stream=True), "tenant-b")
    with pytest.raises(TooManyStreams):  # a request not streamed takes a seat too
        await serving.completions(completion_request(stream=False), "tenant-a")
    events = [chunk async for chunk in first.body_iterator]
    assert events[-1] == b"data: [DONE]\n\n"
    assert serving.streams.num_open("tenant-a") == 0
    again = await serving.completions(completion_request(stream=True), "tenant-a")
    for response in (other, again):  # the client leaves mid-stream: the slot comes back
        await anext(response.body_iterator)
        await response.body_iterator.aclose()
    assert serving.streams.num_open("tenant-a") == serving.streams.num_open("tenant-b") == 0


async def test_a_request_not_streamed_holds_its_tenants_seat_until_it_is_answered(serving):
    plain = asyncio.ensure_future(serving.completions(
        completion_request(stream=False, max_tokens=64), "tenant-a"))
    while serving.engine.stats().num_running == 0:  # until the request is in the engine
        await asyncio.sleep(0)
    assert serving.streams.num_open("tenant-a") == 1
    for stream in (True, False):
        with pytest.raises(TooManyStreams):
            await serving.completions(completion_request(stream=stream), "tenant-a")
    answer = await plain
    assert json.loads(answer.body)["usage"]["completion_tokens"] == 64
    assert serving.streams.num_open("tenant-a") == 0
    again = await serving.completions(completion_request(stream=False), "tenant-a")
    assert again.status_code == 200 and serving.streams.num_open("tenant-a") == 0


async def test_a_request_not_streamed_gives_its_seat_back_when_it_is_refused(serving):
    bad = completion_request(stream=False, min_tokens=1, stop_token_ids=[10**6])
    with pytest.raises(APIError) as err:  # the engine refuses the out-of-vocabulary id
        await serving.completions(bad, "tenant-a")
    assert err.value.status_code == 400
    assert serving.streams.num_open("tenant-a") == 0


def test_kvroute_engine_limits_streams_only_when_the_operator_sets_it():
    assert StreamSlots.for_tenants(False, None) is None
    assert StreamSlots.for_tenants(False, 3).max_per_tenant == 3


def test_tenants_of_api_keys_get_the_default_cap_one_anonymous_user_none_unless_set():
    assert StreamSlots.for_tenants(True, None).max_per_tenant == 64
    assert StreamSlots.for_tenants(True, 5).max_per_tenant == 5
    assert StreamSlots.for_tenants(False, None) is None
    assert StreamSlots.for_tenants(False, 5).max_per_tenant == 5
