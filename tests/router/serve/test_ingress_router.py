"""The ingress request router's body -> RouteCall step (tenant, tokens, block hashes)."""

import json

import pytest

from router.gateway.tenants import TenantAuth
from router.serve.ingress_router import RouteCalls
from worker.openai.prompt import PromptBuilder
from worker.openai.schema import DEFAULT_MAX_TOKENS
from worker.tokenizer_files import tokenizer_dir


@pytest.fixture(scope="module")
def prompts() -> PromptBuilder:
    return PromptBuilder(tokenizer_dir("tiny"), "tiny", 4)


def _body(**fields) -> bytes:
    return json.dumps({"model": "tiny", **fields}).encode()


def test_a_completion_routes_on_its_tokens_and_hashes(prompts):
    calls = RouteCalls(prompts, TenantAuth({}))
    call = calls.of(_body(prompt="hello there, router", max_tokens=7), None)
    ids = prompts.encode_text("hello there, router")
    assert call.prompt_token_ids == ids
    assert call.block_hashes == prompts.block_hashes(ids)
    assert len(call.block_hashes) == len(ids) // 4
    assert call.max_tokens == 7
    ids_call = calls.of(_body(prompt=[40, 41, 42, 43, 44]), None)
    assert ids_call.prompt_token_ids == [40, 41, 42, 43, 44]
    assert ids_call.max_tokens == DEFAULT_MAX_TOKENS
    assert ids_call.route_id != call.route_id


def test_a_batch_routes_on_its_first_prompt(prompts):
    calls = RouteCalls(prompts, TenantAuth({}))
    text_batch = calls.of(_body(prompt=["first of two", "second"], n=2), None)
    assert text_batch.prompt_token_ids == prompts.encode_text("first of two")
    assert text_batch.max_tokens == 2 * 2 * DEFAULT_MAX_TOKENS  # the load of 4 choices
    chat = calls.of(_body(messages=[{"role": "user", "content": "hi"}], n=3, max_tokens=5),
                    None)
    assert chat.max_tokens == 15
    assert calls.of(_body(prompt=[[7, 8, 9], [1]]), None).prompt_token_ids == [7, 8, 9]


def test_a_chat_routes_on_its_templated_tokens(prompts):
    messages = [{"role": "user", "content": "which replica?"}]
    call = RouteCalls(prompts, TenantAuth({})).of(_body(messages=messages, max_tokens=3), None)
    assert call.prompt_token_ids == prompts.encode_chat(messages)
    assert call.max_tokens == 3


def test_the_tenant_of_the_key_names_the_hash_namespace(prompts):
    calls = RouteCalls(prompts, TenantAuth({"key-a": "tenant-a"}))
    call = calls.of(_body(prompt="the same prompt text"), "Bearer key-a")
    ids = prompts.encode_text("the same prompt text")
    assert call.block_hashes == prompts.block_hashes(ids, "tenant-a")
    assert call.block_hashes != prompts.block_hashes(ids)


@pytest.mark.parametrize("body,authorization", [
    (b"not json", None),
    (_body(prompt="x", max_tokens=-1), None),  # the replica answers the 400
    (_body(prompt=""), None),
    (_body(messages=[]), None),
    (_body(prompt=[]), None),
    (_body(prompt=[[]]), None),
    (_body(prompt="hello"), "Bearer wrong-key"),  # the replica answers the 401
])
def test_a_body_it_cannot_route_gets_no_call(prompts, body, authorization):
    calls = RouteCalls(prompts, TenantAuth({"key-a": "tenant-a"}) if authorization
                       else TenantAuth({}))
    assert calls.of(body, authorization) is None
