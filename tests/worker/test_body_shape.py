"""Bodies no request needs are refused before they are parsed, by every front's one check
(worker/openai/limits.py: check_body_shape): the engine's schema (`parse_body`) and the
routers' reader (`load_json`) answer the same 400. Parsing them held a front's only event
loop 170-290 ms, so every other tenant's request waited; a legal body at the limits, and
text full of the characters that are counted, still pass. One list is bounded by the
context (a long context's batch bound let a million token ids in one list through), and an
unknown context is taken as `unknown_context_tokens`."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.engine import MAX_STOP_TOKEN_IDS
from router.front.routing_body import load_json
from worker.openai.errors import APIError
from worker.openai.json_scan import json_shape
from worker.openai.limits import (
    FIELD_STRINGS,
    MAX_MESSAGES,
    RequestLimits,
    max_list_items,
    max_strings_and_objects,
)
from worker.openai.schema import ChatCompletionRequest, CompletionRequest, parse_body

LIMITS = RequestLimits()
CONTEXT_TOKENS = 2048
WORDS = max_strings_and_objects(LIMITS)  # 18 x 4,096 + 300 + 128 + 4,096
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
    return (f"the request body holds {count} strings, lists and objects; no request needs "
            f"more than {WORDS} (at most 4096 messages, 300 logit_bias entries, 128 prompts)")


def _list_message(count: int, context_tokens: int = CONTEXT_TOKENS) -> str:
    return (f"the request body holds a list of {count} items or more; no request needs more "
            f"than {max(context_tokens, FIELD_STRINGS)} (a prompt's token ids within the "
            f"{context_tokens}-token context)")


def _items_message(count: int) -> str:
    return (f"the request body holds {count} list items and fields; no request needs more "
            f"than {ITEMS} (at most 128 prompts of 2048 token ids, the model's context)")


@pytest.mark.parametrize("family, raw, model_cls, message", [
    ("prompt 1M ids", _completion(prompt=[7] * 1_000_000), CompletionRequest,
     _list_message(1_000_000)),
    ("stop_token_ids 1M", _completion(prompt="hi", stop_token_ids=[3] * 1_000_000),
     CompletionRequest, _list_message(1_000_000)),
    ("logit_bias 200k", _completion(prompt="hi", logit_bias={str(i): 1 for i in
                                                             range(200_000)}),
     CompletionRequest, _words_message(200_008)),
    ("100k stop strings", _completion(prompt="hi", stop=["s"] * 100_000), CompletionRequest,
     _words_message(100_008)),
    ("100k prompt strings", _completion(prompt=["x"] * 100_000), CompletionRequest,
     _words_message(100_006)),
    ("100k chat messages", json.dumps({"model": "tiny", "messages": [
        {"role": "user", "content": "x"}] * 100_000}).encode(), ChatCompletionRequest,
     _words_message(500_005)),
    ("100k one-id prompts", _completion(prompt=[[7]] * 100_000), CompletionRequest,
     _words_message(100_006)),
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
    # pad to the cap with lists no longer than one may be: one more comma than a request
    # needs is refused, the cap itself is not
    room = ITEMS - json_shape(raw).commas
    at_cap = _completion(prompt=batch, **_padding(room), **fields)
    assert json_shape(at_cap).commas == ITEMS
    parse_body(at_cap, CompletionRequest, LIMITS, CONTEXT_TOKENS)
    over = _completion(prompt=batch, **_padding(room + 1), **fields)
    assert [e.message for e in _refusals(over, CompletionRequest)] == [
        _items_message(ITEMS + 1)] * 2


def _padding(commas: int) -> dict[str, list[int]]:
    """Unknown fields (ignored by every reader) adding exactly `commas` to a body: each is a
    list of FIELD_STRINGS ids at most (its k items add k - 1, its own separator one)."""
    sizes = [FIELD_STRINGS] * (commas // FIELD_STRINGS) + [commas % FIELD_STRINGS]
    return {f"pad{i}": [0] * k for i, k in enumerate(sizes) if k}


@pytest.mark.parametrize("context_tokens", [32_768, 65_536])
def test_one_list_is_bounded_by_the_context_where_a_batch_of_it_is_not(context_tokens):
    # a million ids fit 128 prompts of this context, not one: refused, and not parsed
    raw = _completion(prompt=[7] * 1_000_000)
    for read in (lambda: parse_body(raw, CompletionRequest, LIMITS, context_tokens),
                 lambda: load_json(raw, LIMITS, context_tokens)):
        with pytest.raises(APIError) as caught:
            read()
        assert (caught.value.code, caught.value.message) == (
            "too_many_values", _list_message(1_000_000, context_tokens))
    # the same ids as a batch of prompts that fit, and one prompt of the context, pass
    batch = [[7] * (context_tokens - 1)] * (1_000_000 // context_tokens)
    for prompt in (batch, [7] * context_tokens):
        raw = _completion(prompt=prompt)
        assert parse_body(raw, CompletionRequest, LIMITS, context_tokens).prompt == prompt
        assert load_json(raw, LIMITS, context_tokens)["prompt"] == prompt


def test_the_most_messages_with_names_and_parts_pass_beside_a_workers_tools():
    message = {"role": "user", "name": "n", "content": [{"type": "text", "text": "a"},
                                                        {"type": "text", "text": "b"}]}
    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "required": ["a", "b"], "properties": {
            "a": {"type": "string", "description": "x"},
            "b": {"type": "array", "items": {"type": "integer"}}}}}}
    fields = {"model": "tiny", "messages": [message] * MAX_MESSAGES,
              "stop": ["x", "y", "z", "w"], "user": "u",
              "stream_options": {"include_usage": True}, "stream": True}
    raw = json.dumps(fields).encode()
    body = parse_body(raw, ChatCompletionRequest, LIMITS, CONTEXT_TOKENS)
    assert len(body.messages) == MAX_MESSAGES and body.messages[0].text() == "ab"
    # the workers gateway forwards tools (kvroute's engine refuses them after this check)
    with_tools = json.dumps({**fields, "tools": [tool] * 20}).encode()
    assert load_json(with_tools, LIMITS, CONTEXT_TOKENS)["user"] == "u"


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


def test_without_a_known_context_lists_are_bounded_by_the_unknown_context_default():
    unknown = LIMITS.unknown_context_tokens  # 131,072: Llama 3.1's context
    at_bound = _completion(prompt=[7] * unknown)
    assert len(parse_body(at_bound, CompletionRequest, LIMITS).prompts()[0]) == unknown
    assert len(load_json(at_bound, LIMITS)["prompt"]) == unknown
    over = _completion(prompt=[7] * (unknown + 1))
    for read in (lambda: parse_body(over, CompletionRequest, LIMITS),
                 lambda: load_json(over, LIMITS)):
        with pytest.raises(APIError) as caught:
            read()
        assert caught.value.message == _list_message(unknown + 1, unknown)
    with pytest.raises(APIError) as caught:
        load_json(_completion(prompt="hi", stop=["s"] * 100_000), LIMITS)
    assert caught.value.message == _words_message(100_008)


def _expected(value, depth=0):
    """(commas, run_commas, objects, lists, strings, depth) of the JSON text of `value`,
    from the value."""
    if isinstance(value, str):
        return 0, 0, 0, 0, 1, depth
    if not isinstance(value, (list, dict)):
        return 0, 0, 0, 0, 0, depth
    items = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
    commas, deepest = max(len(items) - 1, 0), depth + 1
    objects, lists, strings = int(isinstance(value, dict)), int(isinstance(value, list)), 0
    # comma j follows item j: an item that is a list or object splits the run there
    splits = [j for j, (_, item) in enumerate(items) if isinstance(item, (list, dict))]
    ends = [0, *splits, len(items) - 1]
    run = max(0, *(b - a for a, b in zip(ends, ends[1:])))
    for key, item in items:
        c, r, o, lst, s, d = _expected(item, depth + 1)
        commas, objects, lists = commas + c, objects + o, lists + lst
        strings, run = strings + s + (key is not None), max(run, r)
        deepest = max(deepest, d)
    return commas, run, objects, lists, strings, deepest


_TEXT = st.text(alphabet=st.sampled_from('ab,"\\{}[]:\n\u00e9\u4e2d'), max_size=12)
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | _TEXT,
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(_TEXT, inner, max_size=4), max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(_JSON, st.booleans())
def test_the_counts_match_the_parsed_value(value, ascii_only):
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    shape = json_shape(raw)
    assert (shape.commas, shape.run_commas, shape.objects, shape.lists, shape.strings,
            shape.depth) == _expected(value)


def test_what_msgspec_refuses_is_read_by_pythons_parser_only_in_a_small_body(monkeypatch):
    """NaN in a small body: Python's parser reads it and the schema names the field. In a
    large body (a legal batch of token ids and a NaN) only msgspec parses it: a 400 naming
    the byte, not a second, slower parse of everything."""
    import worker.openai.limits as limits

    parses = []
    monkeypatch.setattr(limits.json, "loads", lambda raw: parses.append(len(raw)) or
                        json.JSONDecoder().decode(raw.decode()))
    small = b'{"model": "tiny", "prompt": "hi", "temperature": NaN}'
    with pytest.raises(APIError) as caught:
        parse_body(small, CompletionRequest, LIMITS, CONTEXT_TOKENS)
    assert (caught.value.code, caught.value.param) == ("invalid_value", "temperature")
    assert parses == [len(small)]
    batch = json.dumps([[7] * (CONTEXT_TOKENS - 1)] * 64)  # ~390 KiB: legal at this context
    large = f'{{"model": "tiny", "prompt": {batch}, "temperature": NaN}}'.encode()
    assert len(large) > limits.PYTHON_PARSE_MAX_BYTES
    for read in (lambda: parse_body(large, CompletionRequest, LIMITS, CONTEXT_TOKENS),
                 lambda: load_json(large, LIMITS, CONTEXT_TOKENS)):
        with pytest.raises(APIError) as caught:
            read()
        assert (caught.value.status_code, caught.value.code, caught.value.message) == (
            400, "invalid_json", "the request body is not valid JSON: JSON is malformed: "
                                 f"invalid character (byte {large.index(b'NaN')})")
    assert parses == [len(small)]
