"""Request limits on a live `kvroute engine` over real HTTP: every bad body is
a 4xx with an OpenAI error body, never a 500, and nothing is tokenized or read whole first."""

import httpx
import pytest

from benchmarks.simlib.engine_workers import SIM_TINY_ARGS, EngineWorker
from worker.openai.errors import APIError
from worker.openai.limits import RequestLimits, check_json_depth
from worker.openai.schema import CompletionRequest, parse_body


@pytest.fixture(scope="module")
def worker():
    w = EngineWorker.start(SIM_TINY_ARGS)
    yield w
    assert w.stop() == 0


def post(worker, path: str, content: bytes) -> httpx.Response:
    return httpx.post(worker.base_url.removesuffix("/v1") + path, content=content,
                      headers={"content-type": "application/json"}, timeout=60)


def assert_openai_error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code and error["message"]


def test_deeply_nested_json_is_a_400_not_a_500(worker):
    deep = b"[" * 5000 + b"]" * 5000
    assert_openai_error(post(worker, "/v1/completions", deep), 400, "invalid_json")
    nested_field = b'{"model": "tiny", "prompt": "hi", "user": ' + b"[" * 100 + b"]" * 100 + b"}"
    assert_openai_error(post(worker, "/v1/chat/completions", nested_field), 400,
                        "invalid_json")


def test_oversized_body_is_a_413(worker):
    body = b'{"model": "tiny", "prompt": "' + b"x" * (9 << 20) + b'"}'
    assert_openai_error(post(worker, "/v1/completions", body), 413, "request_too_large")


def test_text_over_the_limit_is_refused_before_tokenizing(worker):
    body = b'{"model": "tiny", "max_tokens": 1, "prompt": "' + b"ab" * 600_000 + b'"}'
    assert_openai_error(post(worker, "/v1/completions", body), 400, "prompt_too_long")
    chat = (b'{"model": "tiny", "messages": [{"role": "user", "content": "'
            + b"ab" * 600_000 + b'"}]}')
    assert_openai_error(post(worker, "/v1/chat/completions", chat), 400, "prompt_too_long")


def test_long_stop_strings_are_refused(worker):
    body = b'{"model": "tiny", "prompt": "hi", "stop": ["' + b"s" * 300 + b'"]}'
    assert_openai_error(post(worker, "/v1/completions", body), 400, "invalid_value")
    ok = post(worker, "/v1/completions",
              b'{"model": "tiny", "prompt": "hi", "max_tokens": 2, "stop": ["zz"]}')
    assert ok.status_code == 200, ok.text


def test_depth_check_ignores_brackets_inside_strings():
    limits = RequestLimits(max_json_depth=3)
    check_json_depth(b'{"a": "[[[[[[{{{{\\"[[[["}', limits)
    check_json_depth(b'{"a": [[1]]}', limits)
    with pytest.raises(APIError):
        check_json_depth(b'{"a": [[[1]]]}', limits)
    body = parse_body(b'{"model": "m", "prompt": "[[[[[[[[[[[["}', CompletionRequest, limits)
    assert body.prompt == "[[[[[[[[[[[["


def test_depth_check_counts_depth_not_openers():
    limits = RequestLimits(max_json_depth=3)
    check_json_depth(b'[[1], [2], [3], {"a": [4]}]', limits)  # 6 openers, 3 deep
    with pytest.raises(APIError):
        check_json_depth(b'[1, [2, [3, [4]]]]', limits)  # 4 openers, 4 deep


@pytest.mark.parametrize("path, fields", [
    ("/v1/completions", b'"temperature": NaN'),
    ("/v1/completions", b'"top_p": Infinity'),
    ("/v1/completions", b'"max_tokens": 1e308'),
    ("/v1/completions", b'"max_tokens": ' + b"9" * 400),
    ("/v1/completions", b'"max_tokens": ' + b"9" * 5000),  # past Python's digit limit
    ("/v1/completions", b'"seed": ' + str(2**64).encode()),
    ("/v1/completions", b'"stop_token_ids": [' + b"1, " * 3_000 + b'1]'),
    ("/v1/chat/completions", b'"min_tokens": 2, "stop_token_ids": [1000000]'),
    ("/v1/chat/completions", b'"temperature": "0.5"'),
])
def test_extreme_sampling_values_are_a_400_and_the_engine_keeps_serving(worker, path,
                                                                        fields):
    head = (b'{"model": "tiny", "prompt": "hi", ' if path == "/v1/completions"
            else b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], ')
    resp = post(worker, path, head + fields + b"}")
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"]
    ok = post(worker, path, head + b'"max_tokens": 2}')
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    assert httpx.get(worker.base_url.removesuffix("/v1") + "/health").status_code == 200


def test_a_million_prompt_ids_are_refused_before_parsing(worker):
    """The engine front counts the body's values against its own context before parsing."""
    context = httpx.get(worker.base_url + "/models", timeout=30).json()["data"][0][
        "max_model_len"]
    body = b'{"model": "tiny", "max_tokens": 1, "prompt": [' + b"7, " * 999_999 + b"7]}"
    resp = post(worker, "/v1/completions", body)
    assert_openai_error(resp, 400, "too_many_values")
    assert resp.json()["error"]["message"] == (
        f"the request body holds a list of 1000000 items or more; no request needs more than "
        f"{max(context, 4096)} (a prompt's token ids within the {context}-token context)")
