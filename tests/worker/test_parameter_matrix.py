"""docs/parameters.md's parameter table against the OpenAI schema both servers validate with:
each row's example, sent in a minimal request, is honoured, refused with a 400 naming the
parameter, or ignored, as the row says."""

import json
import re
from pathlib import Path

import pytest

from worker.openai.errors import APIError
from worker.openai.schema import ChatCompletionRequest, CompletionRequest, parse_body

DOC = Path(__file__).resolve().parents[2] / "docs" / "parameters.md"
ROW = re.compile(r"^\| (\w+) \| (both|completions|chat) \| `(.+?)` \| (supported|400|ignored) \|"
                 r"(.*)\|$")
WITH = re.compile(r"with `(\{.*?\})`")  # a note naming the other fields a row's example needs
BODIES = {
    "completions": (CompletionRequest, {"model": "tiny", "prompt": "Hi"}),
    "chat": (ChatCompletionRequest,
             {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}),
}


def matrix_cases() -> list[tuple[str, str, str, str, str]]:
    """(parameter, endpoint, example JSON, answer, other fields JSON) per endpoint of every
    table row."""
    cases = []
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            name, endpoints, example, answer, notes = match.groups()
            also = WITH.search(notes)
            for endpoint in (("completions", "chat") if endpoints == "both" else (endpoints,)):
                cases.append((name, endpoint, example, answer, also[1] if also else "{}"))
    return cases


CASES = matrix_cases()


def test_the_table_covers_both_endpoints_and_every_answer():
    assert len(CASES) > 40
    # no known OpenAI parameter is ignored any more; "ignored" stays the answer a row may give
    answers = {c[3] for c in CASES}
    assert {"supported", "400"} <= answers <= {"supported", "400", "ignored"}


@pytest.mark.parametrize("name, endpoint, example, answer, also", CASES,
                         ids=[f"{c[0]}={c[2]}-{c[1]}" for c in CASES])
def test_row(name, endpoint, example, answer, also):
    model_cls, body = BODIES[endpoint]
    raw = json.dumps({**body, **json.loads(also), name: json.loads(example)}).encode()
    if answer == "400":
        with pytest.raises(APIError) as err:
            parse_body(raw, model_cls)
        assert (err.value.status_code, err.value.param) == (400, name)
        return
    parsed = parse_body(raw, model_cls)
    if answer == "supported":
        assert name in model_cls.model_fields
        assert getattr(parsed, name) is not None
    else:  # ignored: a field the schema does not know, dropped on parsing
        assert name not in model_cls.model_fields


def test_stop_token_ids_reach_the_engine():
    from worker.openai.engine_params import sampling_params

    body = parse_body(json.dumps({"model": "tiny", "prompt": "Hi", "stop_token_ids": [2, 5]})
                      .encode(), CompletionRequest)
    assert sampling_params(body, 8).stop_token_ids == (2, 5)


def engine_requests_of(endpoint: str, fields: dict):
    from worker.openai.engine_params import engine_requests

    model_cls, body = BODIES[endpoint]
    parsed = parse_body(json.dumps({**body, **fields}).encode(), model_cls)
    kind = "completion" if endpoint == "completions" else "chat"
    prompts = ([[1, 2, 3]] * len(parsed.prompts()) if endpoint == "completions"
               else [[1, 2, 3]])
    return engine_requests(kind, "r", parsed, prompts, 4096)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_honoured_choice_and_sampling_rows_reach_the_engine(endpoint):
    (one,) = engine_requests_of(endpoint, {})
    assert (one.request_id, one.sampling.min_tokens, one.sampling.logprobs) == ("r", 0, None)
    many = engine_requests_of(endpoint, {"n": 3, "seed": 7, "min_tokens": 4})
    assert [r.request_id for r in many] == ["r-0", "r-1", "r-2"]
    assert [r.sampling.seed for r in many] == [7, 8, 9]
    assert {r.sampling.min_tokens for r in many} == {4}
    logprobs = ({"logprobs": 2} if endpoint == "completions"
                else {"logprobs": True, "top_logprobs": 2})
    assert engine_requests_of(endpoint, logprobs)[0].sampling.logprobs == 2
    if endpoint == "chat":
        assert engine_requests_of(endpoint, {"logprobs": True})[0].sampling.logprobs == 0
        assert engine_requests_of(endpoint, {"logprobs": False})[0].sampling.logprobs is None


def test_a_batch_is_one_request_per_prompt_times_n_in_choice_order():
    from worker.openai.engine_params import engine_requests

    parsed = parse_body(json.dumps({"model": "tiny", "prompt": [[5, 6], [7]], "n": 2})
                        .encode(), CompletionRequest)
    requests = engine_requests("completion", "r", parsed, [[5, 6], [7]], 4096, "salt",
                               lambda ids: [bytes(ids)])
    assert [(r.request_id, r.prompt_token_ids, r.block_hashes, r.cache_salt)
            for r in requests] == [("r-0", [5, 6], [b"\x05\x06"], "salt"),
                                   ("r-1", [5, 6], [b"\x05\x06"], "salt"),
                                   ("r-2", [7], [b"\x07"], "salt"),
                                   ("r-3", [7], [b"\x07"], "salt")]
    with pytest.raises(APIError) as err:
        engine_requests("completion", "r", parsed, [[5, 6], [7] * 4090], 4096)
    assert (err.value.status_code, err.value.code) == (400, "context_length_exceeded")
