"""Every number and list of the OpenAI bodies at its extremes: a 400 naming the field, never
a 500, and never a value the engine would take into its per-step work. The bodies are raw
JSON text, so they hold what Python's parser accepts and a client library would not send:
NaN, Infinity, 1e308, an integer of 309 or 5,000 digits."""

import json
import typing

import pytest

from protocol.engine import MAX_STOP_TOKEN_IDS
from worker.openai.errors import APIError
from worker.openai.limits import RequestLimits
from worker.openai.schema import (
    MAX_MESSAGES,
    ChatCompletionRequest,
    CompletionRequest,
    parse_body,
)

COMPLETION = '{"model": "tiny", "prompt": "Hi"'
CHAT = '{"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]'
# every numeric field: the endpoints that take it, and the extremes it accepts
NUMERIC = {
    "max_tokens": ("both", set()),
    "max_completion_tokens": ("chat", set()),
    "temperature": ("both", {"0.5e-320"}),  # sampled greedily (worker/executor/sampling.py)
    "top_p": ("both", {"0.5e-320"}),
    "top_k": ("both", {"-1"}),  # vLLM's "off"
    "min_p": ("both", {"0.5e-320"}),
    "seed": ("both", {"-1"}),
    "n": ("both", set()),
    "min_tokens": ("both", set()),
    "presence_penalty": ("both", set()),
    "frequency_penalty": ("both", set()),
    "repetition_penalty": ("both", set()),
    "best_of": ("completions", set()),
    "logprobs": ("completions", set()),
    "top_logprobs": ("both", set()),
}
EXTREMES = ["1e308", "-1e308", "-1", str(10**309), str(2**64), str(-(2**64)), "NaN",
            "Infinity", "-Infinity", '"0.5"', "true", "[1]", "{}", "0.5e-320"]


def bodies(endpoint: str) -> list[tuple[str, type]]:
    both = [(COMPLETION, CompletionRequest), (CHAT, ChatCompletionRequest)]
    return {"both": both, "completions": both[:1], "chat": both[1:]}[endpoint]


def parse(prefix: str, model_cls: type, fields: str):
    return parse_body(f"{prefix}, {fields}}}".encode(), model_cls)


# every list (and mapping) field, each with its cap in a test below
LISTS = {"prompt", "messages", "stop", "stop_token_ids", "logit_bias", "tools",
         "response_format"}


def fields_of_kind(model_cls: type, kinds: tuple[type, ...]) -> set[str]:
    """Fields whose type is (or may be) one of `kinds` at the top level."""
    def has(annotation) -> bool:
        if annotation in kinds or typing.get_origin(annotation) in kinds:
            return True
        if typing.get_origin(annotation) in (list, dict):
            return False
        return any(has(a) for a in typing.get_args(annotation) if a is not bool)

    return {name for name, f in model_cls.model_fields.items() if has(f.annotation)}


def test_every_numeric_and_list_field_is_covered():
    both = (CompletionRequest, ChatCompletionRequest)
    assert set().union(*(fields_of_kind(m, (int, float)) for m in both)) == set(NUMERIC)
    assert set().union(*(fields_of_kind(m, (list, dict)) for m in both)) == LISTS


@pytest.mark.parametrize("name", sorted(NUMERIC))
def test_numeric_extremes_are_a_400_naming_the_field(name):
    endpoint, accepted = NUMERIC[name]
    for prefix, model_cls in bodies(endpoint):
        for value in EXTREMES:
            if value in accepted:
                parse(prefix, model_cls, f'"{name}": {value}')
                continue
            with pytest.raises(APIError) as err:
                parse(prefix, model_cls, f'"{name}": {value}')
            assert (err.value.status_code, err.value.param) == (400, name), value


@pytest.mark.parametrize("prefix, model_cls", bodies("both"))
def test_an_integer_past_pythons_digit_limit_is_a_400(prefix, model_cls):
    with pytest.raises(APIError) as err:  # was a ValueError out of json.loads: a 500
        parse(prefix, model_cls, f'"max_tokens": {"9" * 5000}')
    assert (err.value.status_code, err.value.code) == (400, "invalid_json")


@pytest.mark.parametrize("prefix, model_cls", bodies("both"))
def test_lists_are_capped(prefix, model_cls):
    def refused(fields: dict) -> str | None:
        with pytest.raises(APIError) as err:
            parse(prefix, model_cls, json.dumps(fields)[1:-1])
        assert err.value.status_code == 400
        return err.value.param

    ids = list(range(MAX_STOP_TOKEN_IDS))
    assert parse(prefix, model_cls, f'"stop_token_ids": {ids}').stop_token_ids == ids
    assert refused({"stop_token_ids": [*ids, 7]}) == "stop_token_ids"
    assert refused({"stop_token_ids": [2**32]}) == "stop_token_ids"
    assert refused({"stop_token_ids": [-1]}) == "stop_token_ids"
    assert refused({"stop_token_ids": [True]}) == "stop_token_ids.0"
    assert refused({"stop": ["a"] * 5}) == "stop"
    assert refused({"stop": ["a", 1]}) == "stop"
    assert refused({"stop": ["x" * 257]}) == "stop"
    assert refused({"logit_bias": {str(i): 1 for i in range(10_000)}}) == "logit_bias"
    assert refused({"response_format": {"type": "json_object"}}) == "response_format"
    assert refused({"min_tokens": 17}) == "min_tokens"  # more than the default 16


def test_prompt_batches_and_tools_are_capped():
    completion = {"model": "tiny", "prompt": ["a"] * 129}  # over the 128-sequence cap
    with pytest.raises(APIError) as err:
        parse_body(json.dumps(completion).encode(), CompletionRequest)
    assert (err.value.status_code, err.value.param) == (400, "prompt")
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"type": "function"}] * 10_000}
    with pytest.raises(APIError) as err:
        parse_body(json.dumps(chat).encode(), ChatCompletionRequest)
    assert (err.value.status_code, err.value.param) == (400, "tools")


def test_chat_messages_are_capped():
    message = {"role": "user", "content": "Hi"}
    body = {"model": "tiny", "messages": [message] * MAX_MESSAGES}
    assert len(parse_body(json.dumps(body).encode(), ChatCompletionRequest).messages) == (
        MAX_MESSAGES)
    with pytest.raises(APIError) as err:
        parse_body(json.dumps({**body, "messages": [message] * (MAX_MESSAGES + 1)}).encode(),
                   ChatCompletionRequest)
    assert (err.value.status_code, err.value.param) == (400, "messages")


def test_tokenize_and_detokenize_bodies_are_capped():
    from worker.openai.prompt import PromptBuilder
    from worker.openai.tokenize import MAX_DETOKENIZE_TOKENS, detokenize, tokenize
    from worker.tokenizer.files import tokenizer_dir

    prompts = PromptBuilder(tokenizer_dir("tiny"), "tiny", 16)
    limits = RequestLimits()
    messages = [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)
    with pytest.raises(APIError) as err:
        tokenize(json.dumps({"messages": messages}).encode(), prompts, lambda m: None,
                 4096, limits)
    assert (err.value.status_code, err.value.param) == (400, "messages")
    raw = b'{"tokens": [' + b"65," * MAX_DETOKENIZE_TOKENS + b"65]}"
    with pytest.raises(APIError) as err:  # at a context that long, the schema's cap
        detokenize(raw, prompts, lambda m: None, limits, 2 * MAX_DETOKENIZE_TOKENS)
    assert (err.value.status_code, err.value.param) == (400, "tokens")
    with pytest.raises(APIError) as err:  # else a list longer than the context, unparsed
        detokenize(raw, prompts, lambda m: None, limits)
    assert (err.value.status_code, err.value.code) == (400, "too_many_values")
    assert detokenize(b'{"tokens": [72, 105]}', prompts, lambda m: None, limits) == {
        "prompt": "Hi"}
