"""Bodies no request needs are refused before they are parsed, by every front's one check
(worker/openai/limits.py: check_body_shape): the engine's schema (`parse_body`) and the
routers' reader (`load_json`) answer the same 400. Parsing them held a front's only event
loop 170-290 ms, so every other tenant's request waited; a legal body at the limits, and
text full of the characters that are counted, still pass."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.engine import MAX_STOP_TOKEN_IDS
from router.front.routing_body import load_json
from worker.openai.errors import APIError
from worker.openai.json_scan import json_shape
from worker.openai.limits import (
    MAX_MESSAGES,
    RequestLimits,
    max_list_items,
    max_strings_and_objects,
)
from worker.openai.schema import ChatCompletionRequest, CompletionRequest, parse_body

LIMITS = RequestLimits()
CONTEXT_TOKENS = 2048
WORDS = max_strings_and_objects(LIMITS)  # 16 x 4,096 + 300 + 128 + 4,096
ITEMS = max_list_items(LIMITS, CONTEXT_TOKENS)  # 128 x 2,048 + 256 + WORDS


def _completion(**fields) -> bytes:
    return json.dumps({"model": "tiny", "max_tokens": 1, **fields}).encode()


def _refusals(raw: bytes, model_cls) -> list[APIError]:
    """What the engine's schema and the routers' reader answer to `raw`."""
    errors = []
    for read in (lambda: parse_body(raw, model_cls, LIMITS, CONTEXT_TOKENS),
                 lambda: load_json(raw, LIMITS, CONTEXT_TOKENS)):
        with pytest.raises(APIError) as caught:
            read()
        errors.append(caught.value)
    return errors


def _words_message(count: int) -> str:
    return (f"the request body holds {count} strings and objects; no request needs more "
            f"than {WORDS} (at most 4096 messages, 300 logit_bias entries, 128 prompts)")


def _items_message(count: int) -> str:
    return (f"the request body holds {count} list items and fields; no request needs more "
            f"than {ITEMS} (at most 128 prompts of 2048 token ids, the model's context)")


@pytest.mark.parametrize("family, raw, model_cls, message", [
    ("prompt 1M ids", _completion(prompt=[7] * 1_000_000), CompletionRequest,
     _items_message(1_000_001)),
    ("stop_token_ids 1M", _completion(prompt="hi", stop_token_ids=[3] * 1_000_000),
     CompletionRequest, _items_message(1_000_002)),
    ("logit_bias 200k", _completion(prompt="hi", logit_bias={str(i): 1 for i in
                                                             range(200_000)}),
     CompletionRequest, _words_message(200_008)),
    ("100k stop strings", _completion(prompt="hi", stop=["s"] * 100_000), CompletionRequest,
     _words_message(100_007)),
    ("100k prompt strings", _completion(prompt=["x"] * 100_000), CompletionRequest,
     _words_message(100_005)),
    ("100k chat messages", json.dumps({"model": "tiny", "messages": [
        {"role": "user", "content": "x"}] * 100_000}).encode(), ChatCompletionRequest,
     _words_message(500_004)),
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "")
def test_a_body_no_request_needs_is_a_400_before_parsing(family, raw, model_cls, message):
    for err in _refusals(raw, model_cls):
        assert (err.status_code, err.type, err.code, err.message) == (
            400, "invalid_request_error", "too_many_values", message), family


def test_a_batch_of_prompts_that_fill_the_context_passes_and_one_id_more_does_not():
    batch = [[5] * (CONTEXT_TOKENS - 1)] * LIMITS.max_sequences
    fields = {"stop_token_ids": list(range(MAX_STOP_TOKEN_IDS))}
    raw = _completion(prompt=batch, **fields)
    body = parse_body(raw, CompletionRequest, LIMITS, CONTEXT_TOKENS)
    assert len(body.prompts()) == LIMITS.max_sequences
    assert load_json(raw, LIMITS, CONTEXT_TOKENS)["prompt"] == batch
    # pad to the cap: one more comma than a request needs is refused, the cap itself is not
    room = ITEMS - json_shape(raw).commas
    at_cap = _completion(prompt=batch, user_ids=[0] * room, **fields)
    assert json_shape(at_cap).commas == ITEMS
    parse_body(at_cap, CompletionRequest, LIMITS, CONTEXT_TOKENS)
    over = _completion(prompt=batch, user_ids=[0] * (room + 1), **fields)
    assert [e.message for e in _refusals(over, CompletionRequest)] == [
        _items_message(ITEMS + 1)] * 2


def test_the_most_messages_with_names_and_parts_pass():
    message = {"role": "user", "name": "n", "content": [{"type": "text", "text": "a"},
                                                        {"type": "text", "text": "b"}]}
    raw = json.dumps({"model": "tiny", "messages": [message] * MAX_MESSAGES,
                      "stop": ["x", "y", "z", "w"], "user": "u",
                      "stream_options": {"include_usage": True}, "stream": True}).encode()
    body = parse_body(raw, ChatCompletionRequest, LIMITS, CONTEXT_TOKENS)
    assert len(body.messages) == MAX_MESSAGES and body.messages[0].text() == "ab"
    assert load_json(raw, LIMITS, CONTEXT_TOKENS)["user"] == "u"


@pytest.mark.parametrize("text", [
    "," * 999_999, '"' * 999_999, "{[" * 499_999, '\\",{' * 249_999, "\\" * 999_999,
    ("a, b, " * 166_666)], ids=["commas", "quotes", "openers", "escapes", "backslashes",
                               "prose"])
def test_text_full_of_counted_characters_passes(text):
    raw = _completion(prompt=text)
    assert parse_body(raw, CompletionRequest, LIMITS, CONTEXT_TOKENS).prompt == text
    assert load_json(raw, LIMITS, CONTEXT_TOKENS)["prompt"] == text
    chat = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": text}]})
    assert parse_body(chat.encode(), ChatCompletionRequest, LIMITS,
                      CONTEXT_TOKENS).messages[0].content == text


def test_without_a_known_context_only_token_ids_are_unbounded():
    ids = _completion(prompt=[7] * 1_000_000)
    assert len(parse_body(ids, CompletionRequest, LIMITS).prompts()[0]) == 1_000_000
    with pytest.raises(APIError) as caught:
        load_json(_completion(prompt="hi", stop=["s"] * 100_000), LIMITS)
    assert caught.value.message == _words_message(100_007)


def _expected(value, depth=0):
    """(commas, objects, strings, depth) of the JSON text of `value`, from the value."""
    if isinstance(value, str):
        return 0, 0, 1, depth
    if not isinstance(value, (list, dict)):
        return 0, 0, 0, depth
    items = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
    commas, objects, strings, deepest = max(len(items) - 1, 0), 0, 0, depth + 1
    objects += isinstance(value, dict)
    for key, item in items:
        c, o, s, d = _expected(item, depth + 1)
        commas, objects, strings = commas + c, objects + o, strings + s + (key is not None)
        deepest = max(deepest, d)
    return commas, objects, strings, deepest


_TEXT = st.text(alphabet=st.sampled_from('ab,"\\{}[]:\n\u00e9\u4e2d'), max_size=12)
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | _TEXT,
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(_TEXT, inner, max_size=4), max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(_JSON, st.booleans())
def test_the_counts_match_the_parsed_value(value, ascii_only):
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    shape = json_shape(raw)
    assert (shape.commas, shape.objects, shape.strings, shape.depth) == _expected(value)
