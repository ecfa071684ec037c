"""The tokens a worker produced, read from the answer the gateway relays: a JSON answer's
usage, a stream's usage event, or one token per event with choices when it has none."""

import json

import pytest

from router.gateway.output_tokens import AnswerUsage, StreamTokens, answer_usage, completion_tokens


def event(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def chunk(text: str) -> dict:
    return {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text}]}


def test_a_json_answer_says_it_in_its_usage():
    answer = json.dumps({"choices": [{"text": "hi"}], "usage": {
        "prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}}).encode()
    assert completion_tokens(answer) == 7


@pytest.mark.parametrize("answer", [b"not json", b"[1, 2]", b'{"usage": null}',
                                    b'{"usage": {"completion_tokens": -1}}',
                                    b'{"usage": {"completion_tokens": 1e308}}',
                                    b'{"usage": {"completion_tokens": true}}'])
def test_an_answer_without_a_count_says_nothing(answer):
    assert completion_tokens(answer) is None


def test_a_stream_counts_an_event_a_token_and_its_usage_event_wins():
    without = StreamTokens()
    without.feed(event(chunk("a")) + event(chunk("b")))  # events relayed in two batches
    without.feed(event(chunk("c")) + event("[DONE]"))
    assert without.tokens == 3
    with_usage = StreamTokens()
    with_usage.feed(event(chunk("a")) + event(chunk("b")))
    with_usage.feed(event({"choices": [], "usage": {"completion_tokens": 5}}) + event("[DONE]"))
    assert with_usage.tokens == 5  # what the worker counted (an event may carry several)
    assert StreamTokens().tokens == 0


def test_the_cached_prompt_tokens_come_with_the_prompt_tokens_they_are_of():
    answer = json.dumps({"usage": {"prompt_tokens": 90, "completion_tokens": 7,
                                   "prompt_tokens_details": {"cached_tokens": 64}}}).encode()
    assert answer_usage(answer) == AnswerUsage(7, 90, 64)
    # vLLM without --enable-prompt-tokens-details: no details
    assert answer_usage(b'{"usage": {"prompt_tokens": 9, "completion_tokens": 1}}') == (
        AnswerUsage(1, 9, None))
    assert answer_usage(b'{"usage": {"prompt_tokens": 9, "completion_tokens": 1, '
                        b'"prompt_tokens_details": {"cached_tokens": -3}}}') == (
        AnswerUsage(1, 9, None))
    stream = StreamTokens()
    stream.feed(event(chunk("a")) + event({"choices": [], "usage": {
        "prompt_tokens": 90, "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 48}}}) + event("[DONE]"))
    assert stream.usage == AnswerUsage(1, 90, 48)
    assert StreamTokens().usage == AnswerUsage()
