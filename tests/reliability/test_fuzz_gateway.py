"""Fuzzing the live gateway from its OpenAPI document: every response to a
generated body is a 2xx, or a 4xx with an OpenAI error body, never a 5xx.

Bounded: a few dozen cases per operation, on a local Ray with one simulated replica and
loopback HTTP only.
"""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.router.serve.serve_helpers import kvroute_server

pytestmark = pytest.mark.slow

MAX_CASES_PER_OPERATION = 25


@pytest.fixture(scope="module")
def server():
    args = {"model": "tiny", "replicas": 1, "engine": "sim", "policy": "cache_aware",
            "num_blocks": 256}
    with kvroute_server(args) as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server):
    return schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")


def test_the_openapi_document_describes_the_request_bodies(server):
    import httpx

    doc = httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/prefixes"):
        schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert "model" in schema["schema"]["properties"] or path == "/v1/prefixes"


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=MAX_CASES_PER_OPERATION, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_fuzzed_bodies_get_a_2xx_or_an_openai_4xx(case):
    if case.path == "/v1/completions" or case.path == "/v1/chat/completions":
        if isinstance(case.body, dict) and case.body.get("stream") is True:
            case.body["stream"] = False  # a stream is read in full below, not left open
    resp = case.call(timeout=60)
    assert resp.status_code < 500, f"{case.method} {case.path}: {resp.status_code} {resp.text}"
    if resp.status_code >= 400:
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, resp.text
        assert isinstance(error["message"], str) and error["message"]
