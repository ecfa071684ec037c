"""Fuzzing any front from one OpenAPI document built from the request models every front
parses (worker/openai/schema.py, worker/openai/tokenize.py): the gateway path serves its
own (tests/reliability/test_fuzz_gateway.py); the engine, the direct path's replica app and
the workers gateway serve none, but parse the same bodies.

Schemathesis generates valid bodies (positive) and bodies that break the schema (negative)
for each operation; each case is sent as the hostile tenant. Counted: cases, 5xx answers,
4xx answers without an OpenAI error body, and cases that got no answer in time.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from benchmarks.hostile.fronts import Front
from worker.openai.openapi_body import request_body
from worker.openai.schema import ChatCompletionRequest, CompletionRequest
from worker.openai.tokenize import DetokenizeRequest, TokenizeCompletionRequest

OPERATIONS = {"/v1/completions": CompletionRequest,
              "/v1/chat/completions": ChatCompletionRequest,
              "/tokenize": TokenizeCompletionRequest, "/detokenize": DetokenizeRequest}
CASE_TIMEOUT_S = 60.0


def openapi_document() -> dict[str, Any]:
    paths = {path: {"post": {"operationId": path.strip("/").replace("/", "_"),
                             "responses": {"200": {"description": "OK"}},
                             **request_body(model)}}
             for path, model in OPERATIONS.items()}
    return {"openapi": "3.1.0", "info": {"title": "kvroute fronts", "version": "1"},
            "paths": paths}


def fuzz_cases(num_cases: int, seed: int = 0) -> list:
    """About `num_cases` schemathesis cases spread over the operations, half positive, half
    negative, generated now: generating costs ~13 ms of CPU a case, and done while sending
    it ran beside the server on the same cores, so the victim measured the harness."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_dict(openapi_document())
    cases: list = []
    operations = [r.ok() for r in schema.get_all_operations()]
    per_run = max(1, num_cases // (2 * len(operations)))
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @hseed(seed)
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=per_run, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            def keep(case):
                if isinstance(case.body, dict) and case.body.get("stream") is True:
                    case.body["stream"] = False  # read whole below, not left open
                cases.append(case)

            keep()
    return cases


def fuzz_front(front: Front, cases: list,
               sent: list[tuple[float, float, str]] | None = None) -> dict[str, int]:
    """Sends each case (`fuzz_cases`) as the hostile tenant, one after the other. Each
    case's (start, end, what) goes in `sent`, to name the case that hurt a victim."""
    counts: Counter[str] = Counter()
    for case in cases:
        counts["cases"] += 1
        start_s = time.monotonic()
        try:
            resp = case.call(base_url=front.base_url, headers=front.hostile_headers,
                             timeout=CASE_TIMEOUT_S)
        except Exception:  # no answer in time, or the connection broke
            counts["no_answer"] += 1
            continue
        finally:
            if sent is not None:
                sent.append((start_s, time.monotonic(), f"{case.path} {str(case.body)[:240]}"))
        counts["5xx"] += resp.status_code >= 500
        if 400 <= resp.status_code < 500 and not _openai_error(resp):
            counts["4xx_without_error_body"] += 1
    return {"cases": counts["cases"], "5xx": counts["5xx"], "no_answer": counts["no_answer"],
            "4xx_without_error_body": counts["4xx_without_error_body"]}


def _openai_error(resp) -> bool:
    try:
        error = resp.json()["error"]
        return isinstance(error.get("message"), str) and bool(error["message"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
