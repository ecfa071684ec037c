"""kvroute in front of two external `kvroute engine` workers (real subprocesses), end to
end over HTTP with the `openai` client: streams and usage pass through, the worker's own
answers to bad input, the admin API, each worker's mode (the first publishes its KV events
in vLLM's format and is routed on them, the second publishes none and is routed on routed
history), and one worker killed under load (every request completes or fails with a clear
error, none hangs; later requests go to the survivor)."""

import asyncio
import contextlib
import math
import os
import signal

import httpx
import openai
import pytest
import ray
from openai.types import Completion
from openai.types.chat import ChatCompletion
from ray import serve

from benchmarks.simlib.engine_workers import SIM_TINY_ARGS, EngineWorker, stop_all
from router.apps.external import workers_application
from router.cli import APP_NAME
from router.cluster.external_worker_probe import metrics_from_text
from router.cluster.hit_bound import find_hit_bound
from router.front.http_server import HttpConfig
from router.serve.settings import ServeSettings
from tests.router.serve.serve_helpers import Server, free_port, latency_counts, wait_until
from worker.openai.tokenize import kvroute_version

pytestmark = pytest.mark.slow

ADMIN_KEY = "admin-key-of-the-e2e-test"
MAX_STREAMS = 12  # per tenant, in the gateway (the kill test holds 12 streams at once)
# Simulated steps timed like an H100 running Llama-3-8B: a 300-token answer streams for
# seconds, long enough to kill its worker mid-way.
SIM_ARGS = (*SIM_TINY_ARGS[:2], "--sim-preset", "h100-llama3-8b")
SHARED = "The system prompt every request of these tests shares. " * 8


@pytest.fixture(scope="module")
def workers():
    started = [EngineWorker([*SIM_ARGS, "--kv-events-port", "0"]), EngineWorker(SIM_ARGS)]
    try:
        for worker in started:
            worker.wait_ready()
        yield started
    finally:
        stop_all(started)


def spec_of(worker: EngineWorker) -> str:
    if worker.kv_events_endpoint is None:
        return worker.url
    return (f"{worker.url}#kv_events={worker.kv_events_endpoint}"
            f"&kv_replay={worker.kv_events_replay_endpoint}")


@pytest.fixture(scope="module")
def server(workers):
    # The gateway processes read the admin key from their environment, which Ray's local
    # processes inherit from this one.
    os.environ["KVROUTE_ADMIN_KEY"] = ADMIN_KEY
    os.environ["KVROUTE_MAX_STREAMS_PER_TENANT"] = str(MAX_STREAMS)
    # A crowded box can start Ray's agents slower than the raylet waits for by default.
    os.environ.setdefault("RAY_agent_register_timeout_ms", "120000")
    port = free_port()
    # one gateway process: the per-tenant limit is counted per gateway (two by default);
    # every block sampled for the pooled bound, so which of the shared prefix's blocks a
    # lower rate keeps decides nothing
    settings = ServeSettings(model="tiny", workers=tuple(spec_of(w) for w in workers),
                             gateways=1, pooled_sample_rate=1.0)
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="serve",
             object_store_memory=128 * 1024**2, log_to_driver=False)
    try:
        serve.start(proxy_location="Disabled")
        serve.run(workers_application(settings, HttpConfig("127.0.0.1", port)),
                  name=APP_NAME, route_prefix=None)
        srv = Server(f"http://127.0.0.1:{port}", {})
        wait_until(lambda: httpx.get(f"{srv.base_url}/ready", timeout=10).status_code == 200,
                   60, "the gateway to see a worker up")
        yield srv
    finally:
        serve.shutdown()
        ray.shutdown()
        del os.environ["KVROUTE_ADMIN_KEY"]
        del os.environ["KVROUTE_MAX_STREAMS_PER_TENANT"]


def client(server, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0,
                         timeout=120, **kw)


def admin(server, method: str, key: str | None = ADMIN_KEY, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, f"{server.base_url}/v1/workers", headers=headers,
                         timeout=30, **kw)


def ready(server, key: str | None = ADMIN_KEY) -> dict:
    """GET /ready's body: the workers are listed with the admin key only."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{server.base_url}/ready", headers=headers, timeout=30).json()


def routed(server) -> dict[str, float]:
    """Routing decisions so far, per worker (this gateway's counter)."""
    return server.by_label("kvroute_router_requests_total", "replica")


def test_streams_pass_through_with_usage_and_cached_tokens(server):
    c = client(server)
    prompt = SHARED + "What is routed where?"
    usages = []
    for _ in range(2):
        chunks = list(c.completions.create(model="tiny", prompt=prompt, max_tokens=8,
                                           stream=True,
                                           stream_options={"include_usage": True}))
        assert chunks[-2].choices[0].finish_reason == "length"
        usages.append(chunks[-1].usage)
    assert usages[0].completion_tokens == usages[1].completion_tokens == 8
    assert usages[0].prompt_tokens == usages[1].prompt_tokens
    # The second request went where the first one's prefix is cached.
    assert usages[1].prompt_tokens_details.cached_tokens >= len(SHARED) - 16
    chat = c.chat.completions.create(model="tiny", max_tokens=4,
                                     messages=[{"role": "user", "content": SHARED}])
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 4


def test_a_tenant_over_its_stream_limit_gets_429_until_a_stream_ends(server):
    # ~16 s of simulated decoding each: still streaming while the others open (a short
    # answer is relayed whole into the socket's buffers and frees its slot at once)
    body = {"model": "tiny", "prompt": "Hold this stream open.", "max_tokens": 2000,
            "stream": True, "ignore_eos": True}
    url = f"{server.base_url}/v1/completions"
    with httpx.Client(timeout=120) as http, contextlib.ExitStack() as held:
        lines = []  # kept: a line iterator that is dropped closes its response
        for _ in range(MAX_STREAMS):
            resp = held.enter_context(http.stream("POST", url, json=body))
            assert resp.status_code == 200
            lines.append(resp.iter_lines())
            next(lines[-1])  # streaming: its slot is taken
        over = http.post(url, json={**body, "max_tokens": 1})
        assert over.status_code == 429 and over.headers["retry-after"] == "1"
        assert over.json()["error"]["code"] == "too_many_concurrent_streams"
        plain = http.post(url, json={**body, "stream": False, "max_tokens": 1})
        assert plain.status_code == 429  # a request not streamed needs a seat too
    # The client closed the held streams: the gateway sees them go and frees their slots.
    with httpx.Client(timeout=120) as http:
        wait_until(lambda: http.post(url, json={**body, "max_tokens": 2}).status_code == 200,
                   30, "a stream slot to come back")


def test_gateway_latency_histograms_time_relayed_answers(server):
    """A streamed answer gets TTFT (its first event), TPOT and e2e; a non-streamed one only
    e2e; both their preprocess time; neither a queue time (another server's engine)."""
    c = client(server)
    before = latency_counts(server)
    list(c.completions.create(model="tiny", prompt="Time my relayed stream.", max_tokens=4,
                              stream=True))
    c.completions.create(model="tiny", prompt="Time my relayed answer.", max_tokens=4)
    grown = {"preprocess": 2, "queue": 0, "ttft": 1, "tpot": 1, "e2e": 2}
    want = {stage: before[stage] + grown[stage] for stage in before}
    wait_until(lambda: latency_counts(server) == want, 30, f"latency counts {want}")


def test_bad_input_gets_the_answer_of_the_gateway_or_the_worker(server):
    c = client(server)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.completions.create(model="other", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):  # the worker's check
        c.completions.create(model="tiny", prompt="x", max_tokens=-1)
    with pytest.raises(openai.BadRequestError, match="prompt"):
        c.completions.create(model="tiny", prompt=[], max_tokens=1)
    bad = httpx.post(f"{server.base_url}/v1/completions", content=b"{", timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"


def test_choices_batches_logprobs_and_tokenizer_routes_pass_through(server):
    c = client(server)
    batch = c.completions.create(model="tiny", prompt=["first prompt", "second one"], n=2,
                                 max_tokens=3, logprobs=2)
    Completion.model_validate(batch.model_dump())
    assert [ch.index for ch in batch.choices] == [0, 1, 2, 3]
    assert batch.usage.completion_tokens == 12
    # the simulated worker's made-up distribution: the sampled token first, at 1/2
    for choice in batch.choices:
        assert choice.logprobs.token_logprobs == pytest.approx([-math.log(2)] * 3)
    chat = c.chat.completions.create(model="tiny", n=2, max_tokens=2, logprobs=True,
                                     top_logprobs=3, messages=[{"role": "user",
                                                                "content": "hi"}])
    ChatCompletion.model_validate(chat.model_dump())
    assert [len(ch.logprobs.content[0].top_logprobs) for ch in chat.choices] == [3, 3]
    with pytest.raises(openai.BadRequestError, match="sequences"):  # the gateway's own cap
        c.completions.create(model="tiny", prompt=["x"] * 65, n=2, max_tokens=1)
    tokens = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "abc"}, timeout=30).json()
    assert tokens["count"] == len(tokens["tokens"]) == 4 and tokens["max_model_len"] > 0
    back = httpx.post(f"{server.base_url}/detokenize", json={"tokens": tokens["tokens"][1:]},
                      timeout=30).json()
    assert back == {"prompt": "abc"}
    assert httpx.get(f"{server.base_url}/version", timeout=30).json() == {
        "version": kvroute_version()}


def test_the_model_list_is_the_workers_own(server, workers):
    """/v1/models answers as kvroute's engine does (the front door's body), with the
    context length the workers list."""
    listed = httpx.get(f"{server.base_url}/v1/models", timeout=30).json()
    assert listed == httpx.get(f"{workers[0].url}/v1/models", timeout=30).json()
    assert listed["data"][0]["max_model_len"] > 0


def test_each_worker_is_routed_in_its_own_mode(server, workers):
    with_events, without = workers

    def modes(worker) -> dict[str, float]:
        client(server).completions.create(model="tiny", prompt="mode", max_tokens=1)
        return server.by_label("kvroute_router_worker_mode", "mode", replica=worker.url)

    wait_until(lambda: modes(with_events) == {"events": 1.0, "approximate": 0.0}, 60,
               "the worker publishing KV events to be routed on them")
    assert modes(without) == {"events": 0.0, "approximate": 1.0}


def test_the_admin_api_needs_the_admin_key_and_changes_where_requests_go(server, workers):
    a, b = workers[0].url, workers[1].url
    assert admin(server, "GET", key=None).status_code == 401
    assert admin(server, "DELETE", key="wrong", params={"url": b}).status_code == 403
    assert {w["url"] for w in admin(server, "GET").json()["data"]} == {a, b}
    public = ready(server, key=None)  # no internal address for everyone to read
    assert public == {"ready": True, "num_workers": 2, "num_workers_up": 2}
    assert {w["url"] for w in ready(server)["workers"]} == {a, b}
    removed = admin(server, "DELETE", params={"url": b})
    assert removed.status_code == 200 and removed.json()["outcome"] == "removed"
    wait_until(lambda: b not in routed(server) and b not in [
        w["url"] for w in ready(server)["workers"]], 30,
        "the gateway to stop routing to the removed worker")
    before = routed(server).get(a, 0.0)
    c = client(server)
    for i in range(6):
        c.completions.create(model="tiny", prompt=f"{i} only a now", max_tokens=1)
    assert routed(server)[a] == before + 6 and b not in routed(server)
    added = admin(server, "POST", json={"url": b + "/v1"})
    assert added.status_code == 201 and added.json()["state"] == "up"
    assert admin(server, "POST", json={"url": b}).status_code == 409
    dead = admin(server, "POST", json={"url": "http://127.0.0.1:1"})
    assert dead.status_code == 502 and "http://127.0.0.1:1 is unreachable" in dead.text
    wait_until(lambda: len(ready(server)["workers"]) == 2,
               30, "the re-added worker in the gateway's view")


def test_the_loss_ladder_reads_the_workers(server, workers):
    """The pooled bound over the gateway's routed prompts, at the capacity the workers
    export (vllm:cache_config_info), and the miss causes of each request, which add up to
    the prompt tokens its worker did not serve from cache (the answer's usage)."""
    capacity_tokens = sum(
        metrics_from_text(httpx.get(f"{w.url}/metrics", timeout=30).text).kv_capacity_tokens
        for w in workers)
    c = client(server)
    bound = find_hit_bound()

    def capacity_known() -> bool:
        """A batch carries the capacity the gateway knows when it is sent: route one."""
        c.completions.create(model="tiny", prompt=f"{SHARED} capacity", max_tokens=1)
        return ray.get(bound.stats.remote())["capacity_blocks"] == capacity_tokens // 16

    wait_until(capacity_known, 30, "the workers' capacity at the hit-bound actor", 0.5)

    def misses() -> float:
        return server.sum_metric("kvroute_miss_tokens_total")

    before, uncached = misses(), 0
    for i in range(4):
        usage = c.completions.create(model="tiny", prompt=f"{SHARED} ladder {i}",
                                     max_tokens=1).usage
        uncached += usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens
    wait_until(lambda: misses() == before + uncached, 30, "the requests' miss causes")

    def rungs() -> dict[str, float]:
        return server.by_label("kvroute_pooled_hit_ratio", "capacity", window="all")

    # the actor pushes its series every second: one push after it learned the capacity
    wait_until(lambda: set(rungs()) == {"0.5x", "1x", "2x", "4x", "inf"}, 30,
               "the bound's series at each capacity multiple")
    ratios = rungs()
    # a larger LRU never hits less; the shared prefix hits
    assert ratios["0.5x"] <= ratios["1x"] <= ratios["2x"] <= ratios["inf"] <= 1
    assert ratios["inf"] > 0
    assert server.sum_metric("kvroute_pooled_sampled_accesses_total") > 0


async def _stream(c: openai.AsyncOpenAI, i: int) -> str:
    """One long stream: 'ok' when it completed, else the error the client raised. Its
    prompt shares no prefix with the others: each stream is charged as the mean output the
    module's short requests taught (not its max_tokens), so a shared cached prefix would
    keep all twelve on the worker that holds it, and none would run on the one killed."""
    try:
        stream = await c.completions.create(model="tiny", prompt=f"stream {i} of the kill",
                                            max_tokens=300, stream=True,
                                            extra_body={"ignore_eos": True})
        finish = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        return "ok" if finish == "length" else f"ended without finishing: {finish}"
    except openai.APIError as err:
        return f"error: {err}"


def test_a_worker_killed_under_load(server, workers):
    victim, survivor = workers[1], workers[0]
    wait_until(lambda: victim.url in routed(server) or not httpx.post(
        f"{server.base_url}/v1/completions", timeout=60,
        json={"model": "tiny", "prompt": "warm", "max_tokens": 1}).is_error, 30,
        "both workers routable")

    def victim_series(name: str) -> float:
        text = httpx.get(f"{victim.url}/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name))

    generated_before = victim_series("kvroute_engine_generation_tokens_total")

    def running_on_victim() -> bool:
        # streaming, past their first token: a kill before it would be retried elsewhere
        return (victim_series("vllm:num_requests_running") > 0 and victim_series(
            "kvroute_engine_generation_tokens_total") >= generated_before + 8)

    async def load() -> list[str]:
        c = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="none",
                               max_retries=0, timeout=120)
        tasks = [asyncio.create_task(_stream(c, i)) for i in range(12)]
        await asyncio.to_thread(wait_until, running_on_victim, 60,
                                "streams running on the victim")
        os.kill(victim.proc.pid, signal.SIGKILL)
        return await asyncio.gather(*tasks)

    results = asyncio.run(load())
    failed = [r for r in results if r != "ok"]
    assert failed, "no stream was running on the killed worker"
    for result in failed:  # cut mid-stream: an error event (naming no worker), no replay
        assert result.startswith("error:") and "failed mid-response" in result, result
        assert victim.url not in result
    def down() -> dict[str, str]:
        return {w["url"]: w["error"] for w in ready(server)["workers"]
                if w["state"] == "down"}

    # the worker set's next health check finds it gone (a failed stream alone does not)
    wait_until(lambda: list(down()) == [victim.url], 30, "the victim listed down")
    assert "unreachable" in down()[victim.url]
    before = routed(server).get(survivor.url, 0.0)
    c = client(server)
    for i in range(8):
        done = c.completions.create(model="tiny", prompt=f"after {i}", max_tokens=2)
        assert done.choices[0].finish_reason == "length"
    assert routed(server)[survivor.url] == before + 8
    assert victim.url not in routed(server)
