"""What a routed request found cached, handed to the router in front through the ASGI scope
(worker/openai/prompt_hits.py): the first prompt's cached tokens, the least of its choices,
streamed or not."""

import asyncio
import json

import pytest
from starlette.requests import Request

from worker.engine.config import EngineConfig
from worker.engine.factory import build_engine
from worker.openai.front import Anonymous, FrontDoor, fixed_context
from worker.openai.limits import RequestLimits
from worker.openai.prompt import PromptBuilder
from worker.openai.prompt_hits import PROMPT_HITS_KEY, PromptHits
from worker.openai_server.serving import OpenAIServing
from worker.tokenizer.files import tokenizer_dir

PROMPT = "a prompt of forty bytes, two full blocks"  # 40 bytes: 2 full blocks of 16


def completion_request(hits: PromptHits | None, stream: bool, **fields) -> Request:
    body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "ignore_eos": True,
                       "stream": stream, **fields}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [],
             "query_string": b""}
    if hits is not None:
        scope[PROMPT_HITS_KEY] = hits
    return Request(scope, receive)


@pytest.fixture
async def serving():
    engine = build_engine(EngineConfig(model="tiny", engine="sim", sim_preset="tiny",
                                       num_blocks=64, block_size=16))
    door = FrontDoor("tiny", PromptBuilder(tokenizer_dir("tiny"), "tiny", 16),
                     RequestLimits(), Anonymous(), None, fixed_context(engine.max_model_len))
    yield OpenAIServing(engine, door)
    await engine.shutdown()


async def _run(serving: OpenAIServing, hits: PromptHits | None, stream: bool, **fields
               ) -> int:
    """The response's usage.prompt_tokens_details.cached_tokens."""
    response = await serving.completions(completion_request(hits, stream, **fields))
    if not stream:
        return json.loads(response.body)["usage"]["prompt_tokens_details"]["cached_tokens"]
    events = [chunk async for chunk in response.body_iterator]
    usage = json.loads(events[-2].removeprefix(b"data: "))["usage"]
    return usage["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("stream", [False, True])
async def test_the_routed_prompts_cached_tokens_reach_the_scope(serving, stream):
    first, again = PromptHits(), PromptHits()
    fields = {"stream_options": {"include_usage": True}} if stream else {}
    assert await _run(serving, first, stream, **fields) == 0
    assert first.cached_tokens == 0
    assert await _run(serving, again, stream, **fields) == 32
    assert again.cached_tokens == 32


async def test_of_n_choices_the_one_that_hit_least_counts(serving):
    hits = PromptHits()
    assert await _run(serving, hits, False, n=3) == 0  # its copies hit what the first computed
    assert hits.cached_tokens == 0



@pytest.mark.parametrize("stream", [False, True])
async def test_the_tokens_every_choice_produced_reach_the_scope(serving, stream):
    hits = PromptHits()
    assert hits.output_tokens is None  # no engine request streamed: unknown
    fields = {"stream_options": {"include_usage": True}} if stream else {}
    await _run(serving, hits, stream, n=3, **fields)  # 3 choices of max_tokens 2, no EOS
    assert hits.output_tokens == 6
    batch = PromptHits()  # a batch: the second prompt's tokens count too
    response = await serving.completions(completion_request(batch, False, prompt=[PROMPT, "x"]))
    assert response.status_code == 200 and batch.output_tokens == 4
