"""A failed engine step tells its clients, and the unauthenticated /health, a stable text:
never the exception's, which may name hosts, paths or another request's values. The
replica's log keeps the exception with its traceback.

`kvroute engine`'s app in process (the real engine over the simulated executor), its
executor's steps failing as a lost tensor-parallel rank fails them (a fault the simulated
executor cannot have by itself)."""

import json
import logging

import httpx
import pytest

from tests.worker.engine.test_engine_sim import _FailingSteps, make_engine
from worker.openai.prompt import PromptBuilder
from worker.openai_server.app import create_app
from worker.openai_server.kv_events import EventPump
from worker.process_settings import ProcessSettings
from worker.tokenizer.files import tokenizer_dir

SECRET = "rank 1 is gone"  # what _FailingSteps raises: no client may read it
STEP_FAILED_BODY = {"error": {
    "message": "the engine failed: a step that ran this request failed (the replica logged "
               "why)", "type": "server_error", "param": None, "code": "engine_error"}}


@pytest.fixture
def failing_engine():
    engine = make_engine()
    engine.executor = _FailingSteps(engine.executor, 3)
    return engine


def _client(engine) -> httpx.AsyncClient:
    app = create_app(engine, PromptBuilder(tokenizer_dir("tiny"), "tiny", 16),
                     EventPump(engine.drain_events, None), ProcessSettings())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine")


async def test_a_failed_step_tells_the_client_and_health_no_exception_text(
        failing_engine, caplog):
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": 2}
    with caplog.at_level(logging.ERROR, logger="worker.engine.engine"):
        async with _client(failing_engine) as client:
            whole = await client.post("/v1/completions", json=body)
            streamed = await client.post("/v1/completions", json={**body, "stream": True})
            chat = await client.post("/v1/chat/completions", json={
                "model": "tiny", "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]})
            health = await client.get("/health")
    assert (whole.status_code, whole.json()) == (500, STEP_FAILED_BODY)
    assert (chat.status_code, chat.json()) == (500, STEP_FAILED_BODY)
    events = [json.loads(line.removeprefix("data: ")) for line in streamed.text.splitlines()
              if line.startswith("data: ")]
    assert (streamed.status_code, events) == (200, [STEP_FAILED_BODY])
    assert health.status_code == 503
    assert health.json()["error"]["message"] == ("the last 3 engine steps failed (the "
                                                 "replica logged why)")
    for answer in (whole, streamed, chat, health):
        assert SECRET not in answer.text
    tracebacks = [r for r in caplog.records if r.exc_info and SECRET in str(r.exc_info[1])]
    assert [r.getMessage() for r in tracebacks] == ["step failed"] * 3
    await failing_engine.shutdown()
