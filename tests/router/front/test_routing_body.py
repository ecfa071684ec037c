"""The ingress router and the gateway to external workers read a body for routing with one
reader: the same body routes on the same tokens and charges the same output, or is refused
by both (the gateway answers the 4xx; the ingress router routes it by load alone)."""

import json

import pytest

from router.front.tenants import TenantAuth
from router.gateway.routed_body import chat_body, completion_body
from router.serve.route_calls import RouteCalls
from worker.openai.errors import APIError
from worker.openai.limits import RequestLimits
from worker.openai.prompt import PromptBuilder
from worker.tokenizer.files import tokenizer_dir

LARGE_CONTEXT_TOKENS = 1 << 20  # the context does not bind: only the shared rules do
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def prompts() -> PromptBuilder:
    return PromptBuilder(tokenizer_dir("tiny"), "tiny", 16)


@pytest.mark.parametrize("fields, total", [
    ({"prompt": "hello"}, 16),  # OpenAI's default output
    ({"prompt": "hello", "max_tokens": 5, "n": 3}, 15),
    ({"prompt": "hello", "max_tokens": 5, "max_completion_tokens": 7}, 7),  # it wins
    ({"prompt": ["ab", "cd"], "max_tokens": 2, "n": 2}, 8),
    ({"prompt": [[5, 6], [7]], "max_tokens": 1}, 2),
    ({"messages": CHAT, "max_completion_tokens": 4, "n": 2}, 8),
    ({"messages": CHAT, "max_tokens": 3}, 3),
    ({"prompt": "x", "n": 0}, None),
    ({"prompt": "x", "n": True}, None),
    ({"prompt": "x", "n": 1.0}, None),
    ({"prompt": "x", "n": "2"}, None),
    ({"prompt": "x", "n": 129}, None),  # over the sequence cap
    ({"prompt": ["x"] * 65, "n": 2}, None),
    ({"prompt": "x", "max_tokens": 0}, None),
    ({"prompt": "x", "max_completion_tokens": -1, "max_tokens": 5}, None),
    ({"prompt": "x", "max_tokens": 1 << 70}, None),
    ({"messages": CHAT, "n": 0}, None),
    ({"messages": [], "max_tokens": 1}, None),
    ({"prompt": [-1]}, None),
    ({"prompt": [True]}, None),
    ({"prompt": ""}, None),
])
def test_both_routers_read_a_body_by_the_same_rules(prompts, fields, total):
    raw = json.dumps({"model": "tiny", **fields}).encode()
    limits = RequestLimits()
    call = RouteCalls(prompts, TenantAuth({}), LARGE_CONTEXT_TOKENS, limits).of(raw, None)
    read = chat_body if "messages" in fields else completion_body
    if total is None:
        assert call is None
        with pytest.raises(APIError) as refused:
            read(raw, prompts, "tiny", "", limits)
        assert refused.value.status_code == 400
        return
    routed = read(raw, prompts, "tiny", "", limits)
    assert call is not None
    assert (call.max_tokens, call.prompt_token_ids) == (total, routed.token_ids)
    assert routed.max_tokens == total
