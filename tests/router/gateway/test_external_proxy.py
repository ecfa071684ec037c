"""The proxy to external workers against real `kvroute engine` workers (no Ray): retries
before the first byte, the worker's own answers passed through, a stream relayed as is,
and an error event when a worker dies mid-stream."""

import json

import pytest

from benchmarks.simlib.engine_workers import SIM_TINY_ARGS, EngineWorker
from router.cluster.external_worker_spec import WorkerSpec
from router.gateway.external_proxy import ExternalProxy
from router.gateway.output_tokens import AnswerUsage
from worker.openai.errors import APIError

pytestmark = pytest.mark.slow

DEAD = [WorkerSpec(f"http://127.0.0.1:{port}") for port in (1, 2, 3)]  # nothing listens


@pytest.fixture(scope="module")
def worker():
    w = EngineWorker.start(SIM_TINY_ARGS)
    yield w
    w.stop()


class Picks:
    """Hands out workers in order and records every release."""

    def __init__(self, *workers: WorkerSpec):
        self.workers = list(workers)
        self.released: list[tuple[str, bool]] = []  # (worker id, failed)
        # each release's refused / violation flags and output tokens
        self.kinds: list[dict[str, bool | int | None]] = []

    def pick(self, tried: frozenset[str]) -> WorkerSpec:
        assert tried == {w.worker_id for w in self.workers[: len(tried)]}
        return self.workers[len(tried)]

    def release(self, worker_id: str, error: str | None, **kind: bool | int | None) -> None:
        self.released.append((worker_id, error is not None))
        self.kinds.append(kind)


def body(**kw) -> bytes:
    return json.dumps({"model": "tiny", "prompt": "hello there", **kw}).encode()


async def read_all(response) -> bytes:
    return b"".join([chunk async for chunk in response.body_iterator])


async def test_a_worker_that_cannot_be_reached_is_released_failed_and_the_next_answers(
        worker):
    live = WorkerSpec.parse(worker.url)
    picks = Picks(DEAD[0], live)
    proxy = ExternalProxy()
    try:
        response = await proxy.forward("/v1/completions", body(max_tokens=2), picks.pick,
                                       picks.release)
        assert response.status_code == 200
        usage = json.loads(response.body)["usage"]
        assert usage["completion_tokens"] == 2
        assert picks.released == [(DEAD[0].worker_id, True), (live.worker_id, False)]
        # the router learns what it produced, and what hit of its prompt
        assert picks.kinds[-1] == {"output_tokens": 2, "usage": AnswerUsage(
            2, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"])}
    finally:
        await proxy.aclose()


async def test_when_every_attempt_fails_the_client_gets_a_503_naming_the_last_failure():
    picks = Picks(*DEAD)
    proxy = ExternalProxy()
    try:
        with pytest.raises(APIError) as info:
            await proxy.forward("/v1/completions", body(), picks.pick, picks.release)
    finally:
        await proxy.aclose()
    assert info.value.status_code == 503
    assert info.value.message == "no worker could serve the request after 3 attempt(s)"
    assert picks.released == [(w.worker_id, True) for w in DEAD]


async def test_the_workers_own_error_is_the_answer_and_is_not_retried(worker):
    live = WorkerSpec.parse(worker.url)
    picks = Picks(live)
    proxy = ExternalProxy()
    try:
        response = await proxy.forward("/v1/completions", body(max_tokens=0), picks.pick,
                                       picks.release)
    finally:
        await proxy.aclose()
    assert response.status_code == 400
    assert json.loads(response.body)["error"]["param"] == "max_tokens"
    assert picks.released == [(live.worker_id, False)]
    assert picks.kinds == [{"refused": True}]  # it ran nothing: the router withdraws it


async def test_a_stream_is_relayed_byte_for_byte_with_its_usage(worker):
    live = WorkerSpec.parse(worker.url)
    picks = Picks(live)
    proxy = ExternalProxy()
    try:
        response = await proxy.forward(
            "/v1/completions", body(max_tokens=5, stream=True, ignore_eos=True,
                                    stream_options={"include_usage": True}),
            picks.pick, picks.release)
        assert response.headers["content-type"].startswith("text/event-stream")
        assert picks.released == []  # still streaming
        events = (await read_all(response)).decode().split("\n\n")
    finally:
        await proxy.aclose()
    assert events[-2:] == ["data: [DONE]", ""]
    usage = json.loads(events[-3].removeprefix("data: "))["usage"]
    assert usage["completion_tokens"] == 5 and "cached_tokens" in usage["prompt_tokens_details"]
    assert picks.released == [(live.worker_id, False)]
    assert picks.kinds == [{"output_tokens": 5, "usage": AnswerUsage(
        5, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"])}]


async def test_a_worker_dying_mid_stream_ends_it_with_an_error_event():
    # Timed like an H100 running Llama 3 8B: 400 tokens stream for seconds.
    victim = EngineWorker.start((*SIM_TINY_ARGS[:2], "--sim-preset", "h100-llama3-8b"))
    spec = WorkerSpec.parse(victim.url)
    picks = Picks(spec)
    proxy = ExternalProxy()
    try:
        response = await proxy.forward(
            "/v1/completions", body(max_tokens=400, stream=True, ignore_eos=True),
            picks.pick, picks.release)
        chunks = response.body_iterator
        first = await anext(chunks)
        assert first.startswith(b"data: {")
        victim.kill()
        rest = b"".join([chunk async for chunk in chunks])
    finally:
        victim.kill()
        await proxy.aclose()
    last = rest.decode().strip().split("\n\n")[-1]
    error = json.loads(last.removeprefix("data: "))["error"]
    assert error["code"] == "worker_lost" and spec.url not in error["message"]
    assert picks.released == [(spec.worker_id, True)]
