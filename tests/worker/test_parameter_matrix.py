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
ROW = re.compile(r"^\| (\w+) \| (both|completions|chat) \| `(.+)` \| (supported|400|ignored) \|")
BODIES = {
    "completions": (CompletionRequest, {"model": "tiny", "prompt": "Hi"}),
    "chat": (ChatCompletionRequest,
             {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}),
}


def matrix_cases() -> list[tuple[str, str, str, str]]:
    """(parameter, endpoint, example JSON, answer) per endpoint of every table row."""
    cases = []
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            name, endpoints, example, answer = match.groups()
            for endpoint in (("completions", "chat") if endpoints == "both" else (endpoints,)):
                cases.append((name, endpoint, example, answer))
    return cases


CASES = matrix_cases()


def test_the_table_covers_both_endpoints_and_every_answer():
    assert len(CASES) > 40
    # no known OpenAI parameter is ignored any more; "ignored" stays the answer a row may give
    assert {"supported", "400"} <= {answer for *_, answer in CASES} <= {"supported", "400",
                                                                          "ignored"}


@pytest.mark.parametrize("name, endpoint, example, answer", CASES,
                         ids=[f"{c[0]}={c[2]}-{c[1]}" for c in CASES])
def test_row(name, endpoint, example, answer):
    model_cls, body = BODIES[endpoint]
    raw = json.dumps({**body, name: json.loads(example)}).encode()
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
