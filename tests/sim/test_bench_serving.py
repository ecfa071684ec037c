"""bench_serving's client against a real engine (sim executor) behind a minimal OpenAI
completions endpoint built from the gateway's own response shapes, served by uvicorn on a
loopback port in a thread of the test (no Ray)."""

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from benchmarks import bench_serving
from benchmarks.simlib.openai_load import LoadConfig, LoadGenerator
from benchmarks.simlib.prompts import TokenSource
from benchmarks.simlib.workloads import multi_turn
from protocol.engine import EngineRequest, SamplingParams
from worker.engine.config import EngineConfig
from worker.engine.factory import build_engine
from worker.openai.responses import ResponseShape, sse


def completions_app(engine, bodies: list | None = None):
    async def completions(request: Request):
        body = json.loads(await request.body())
        if bodies is not None:
            bodies.append(body)
        prompt = body["prompt"]
        token_ids = list(prompt.encode()) if isinstance(prompt, str) else prompt
        req = EngineRequest(f"cmpl-{uuid.uuid4().hex}", token_ids, SamplingParams(
            max_tokens=body["max_tokens"], ignore_eos=body["ignore_eos"]))
        shape = ResponseShape.new("completion", req.request_id, "tiny")

        async def stream():
            usage = None
            async for d in engine.generate(req):
                yield sse(shape.chunk(d.text, d.finish_reason))
                usage = d.usage or usage
            yield sse(shape.usage_chunk(usage))
            yield sse("[DONE]")

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def engine():
    return build_engine(EngineConfig(model="tiny", engine="sim", sim_preset="tiny",
                                     num_blocks=256))


@contextmanager
def serving(app) -> Iterator[str]:
    """`app` on a free loopback port, in a thread; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    try:
        while not server.started:  # polls uvicorn's own flag; the thread sets it
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            threading.Event().wait(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_shared_prefix_groups_hit_their_prefix_after_the_first_request():
    with serving(completions_app(engine())) as url:
        out = bench_serving.main(["--base-url", url, "--workload",
                                  "generated_shared_prefix", "--set", "num_groups=2", "--set",
                                  "prompts_per_group=3", "--set", "system_prompt_len=64",
                                  "--set", "question_len=16", "--set", "output_len=4"])
    assert out["num_ok"] == out["num_requests"] == 6
    assert out["prompt_tokens"] == 6 * 80 and out["completion_tokens"] == 6 * 4
    # Per group, the first request computes the 4-block prefix; the other two hit it.
    assert out["cached_tokens"] == 2 * 2 * 64


def test_text_prompts_are_one_character_per_token():
    with serving(completions_app(engine())) as url:
        out = bench_serving.main(["--base-url", url, "--workload", "prefix_repetition",
                                  "--prompt-format", "text", "--max-requests", "3", "--set",
                                  "prefix_len=32", "--set", "suffix_len=8", "--set",
                                  "output_len=2"])
    assert out["num_ok"] == 3 and out["prompt_tokens"] == 3 * 40


def test_a_round_is_sent_after_the_answer_to_the_previous_one_with_its_history():
    workload = multi_turn(num_clients=2, num_rounds=2, request_len=32, output_len=3,
                          rate_qps=float("inf"))
    with serving(completions_app(engine())) as url:
        gen = LoadGenerator(LoadConfig(url, "tiny"), workload, TokenSource(0, 32, 127))
        recs = {r.request_id: r for r in asyncio.run(gen.run())}
    assert all(r.error is None for r in recs.values())
    for c in range(2):
        first, second = recs[f"mt-c{c}-r0"], recs[f"mt-c{c}-r1"]
        assert second.sent_s >= first.done_s
        assert second.prompt_tokens > first.prompt_tokens + 32  # history + answer + new
        assert second.cached_tokens >= 32  # at least the first prompt's two full blocks


def test_a_list_of_servers_is_sent_to_in_turn():
    workload = multi_turn(num_clients=4, num_rounds=1, request_len=32, output_len=2,
                          rate_qps=float("inf"))
    seen: tuple[list, list] = ([], [])
    with (serving(completions_app(engine(), seen[0])) as a,
          serving(completions_app(engine(), seen[1])) as b):
        gen = LoadGenerator(LoadConfig("http://unused", "tiny"), workload,
                            TokenSource(0, 32, 127), base_urls=[a, b])
        recs = asyncio.run(gen.run())
    assert len(recs) == 4 and all(r.error is None for r in recs)
    assert [len(bodies) for bodies in seen] == [2, 2]
