"""`kvroute serve --ingress direct` end to end: HAProxy asks kvroute's ingress request router
for an engine replica and sends the request to that replica's own HTTP server (Ray Serve's
direct streaming). Simulated engine (preset tiny), 2 replicas, started with the CLI.

The official openai client, cache affinity with the router's prediction equal to the
engine's hits, tenants, bad input answered by the replica with the right 4xx, the routers'
outstanding load back to 0 once requests end, client disconnects, metrics, and a killed
replica.
"""

import concurrent.futures
import json
import math
from collections import Counter

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from router.serve.route_tracking import ROUTED_BY_HEADER
from tests.router.serve import shared_prefix_traffic as traffic
from tests.router.serve.cli_server import kvroute_cli_server
from tests.router.serve.serve_helpers import (
    assert_latency_histograms_count_each_request,
    assert_model_list,
    wait_until,
)
from worker.openai.tokenize import kvroute_version

pytestmark = pytest.mark.slow

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
SHARED = "You are a meticulous assistant. Answer briefly and cite sources. " * 10


def direct_flags(workdir) -> list[str]:
    keys_file = workdir / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    return ["--model", "tiny", "--ingress", "direct", "--engine", "sim", "--sim-preset", "tiny",
            "--num-blocks", "256", "--api-keys-file", str(keys_file)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("direct")
    flags = direct_flags(workdir)  # the default number of ingress routers
    with kvroute_cli_server(flags, 2, workdir / "serve.log",
                            routed_probe={"Authorization": "Bearer key-a"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="key-a", timeout=60,
                         max_retries=0)


def _outstanding(server) -> float:
    return server.sum_metric("kvroute_router_outstanding_requests")


def test_openai_client_completions_and_chat(server, oai):
    assert [m.id for m in oai.models.list().data] == ["tiny"]
    assert_model_list(server.base_url, "key-a")
    c = oai.completions.create(model="tiny", prompt="Hello, kvroute!", max_tokens=5,
                               temperature=0, extra_body={"ignore_eos": True})
    assert c.choices[0].finish_reason == "length"
    assert c.usage.prompt_tokens == len("Hello, kvroute!") + 1  # bytes + BOS
    assert c.usage.completion_tokens == 5
    chunks = list(oai.completions.create(model="tiny", prompt="Hello, kvroute!", max_tokens=5,
                                         temperature=0, stream=True,
                                         stream_options={"include_usage": True},
                                         extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 5
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    messages = [{"role": "user", "content": "Hi"}]
    chat = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 4
    parts = list(oai.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                             stream=True, extra_body={"ignore_eos": True}))
    assert parts[0].choices[0].delta.role == "assistant"
    assert parts[-1].choices[0].finish_reason == "length"


def test_shared_prefix_lands_on_the_replica_that_holds_it(server, oai):
    # Every ingress router has routed once: a router's first decision waits for its index
    # mirror's first poll, which on a crowded box can outlast HAProxy's router timeout, so
    # HAProxy asks the other router too and the late decision is counted as well.
    traffic.wait_routed(server.base_url, {"Authorization": "Bearer key-a"})
    base = traffic.settled(server)
    before = server.by_label("kvroute_router_requests_total", "replica")
    predicted_before = server.sum_metric("kvroute_router_predicted_hit_tokens_total")
    cached, decided = [], Counter()
    for i in range(5):
        # each prompt once every router has the previous ones' pending marks (a prompt
        # faster than that hop would race them: shared_prefix_traffic.py)
        wait_until(lambda: traffic.applied_since(server, base, decided), 60,
                   "every router to apply the decisions the others shared")
        raw = oai.completions.with_raw_response.create(
            model="tiny", prompt=SHARED + f"Question {i}?", max_tokens=2, temperature=0)
        decided[raw.headers.get(ROUTED_BY_HEADER)] += 1
        cached.append(raw.parse().usage.prompt_tokens_details.cached_tokens)

    # Each replica caches on its own: every later request hitting the shared prefix is the
    # proof that all five went to the replica that holds it.
    assert cached[0] == 0
    assert all(c >= (len(SHARED) + 1) // 16 * 16 for c in cached[1:])

    def routed() -> list[float] | None:
        """Routed per replica since `before`, once one replica's count includes all five
        (each router process pushes its series to the hub every second, so with two the
        five arrive in two pushes; on a crowded box a push of the previous test's decisions
        can land after `before` was read, hence >=, and counts on the other replica)."""
        after = server.by_label("kvroute_router_requests_total", "replica")
        counts = sorted(after.get(r, 0) - before.get(r, 0) for r in after)
        return counts if counts and counts[-1] >= 5 else None

    wait_until(routed, 30, "one replica's routed count to include all five decisions")
    predicted = server.sum_metric("kvroute_router_predicted_hit_tokens_total")
    assert predicted - predicted_before >= sum(cached)


def test_tenants_never_share_cache(server):
    body = {"model": "tiny", "prompt": "Tenant isolation check: " + "abcdefgh" * 8,
            "max_tokens": 1}
    with server.client() as http:
        a1 = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer key-a"})
        a2 = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer key-a"})
        b1 = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer key-b"})
    cached = [r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (a1, a2, b1)]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0


@pytest.mark.parametrize("headers,raw,status,code", [
    ({}, b'{"model": "tiny", "prompt": ', 400, "invalid_json"),
    ({}, b'{"model": "gpt-9", "prompt": "x"}', 404, "model_not_found"),
    ({}, b'{"model": "tiny", "prompt": "x", "max_tokens": 0}', 400, "invalid_value"),
    ({}, b'{"model": "tiny", "prompt": "x", "max_tokens": 100000}', 400,
     "context_length_exceeded"),
    ({"Authorization": "Bearer wrong"}, b'{"model": "tiny", "prompt": "x"}', 401,
     "invalid_api_key"),
])
def test_bad_input_is_the_replicas_4xx(server, headers, raw, status, code):
    sent = {"Authorization": "Bearer key-a", "Content-Type": "application/json", **headers}
    with server.client() as http:
        resp = http.post("/v1/completions", content=raw, headers=sent)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code


def test_the_routers_load_drops_when_requests_end(server, oai):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda i: oai.completions.create(
            model="tiny", prompt=f"load {i} " * 8, max_tokens=8,
            extra_body={"ignore_eos": True}).usage.completion_tokens, range(16)))
    assert done == [8] * 16
    wait_until(lambda: _outstanding(server) == 0, 30,
               "every routed request's end to reach its router")


def test_requests_that_run_nothing_leave_no_load(server):
    """A POST to an unknown path or a tokenizer route with a routable body, and bodies with
    unbounded numbers: the replica answers, and the router holds nothing for them (the
    replica reports every routed request's end, an unbounded one is never charged)."""
    prompt = "nothing runs " * 8
    with httpx.Client(base_url=server.base_url, timeout=30,
                      headers={"Authorization": "Bearer key-a"}) as http:
        for path, fields, status in (
                ("/v1/nothing", {"prompt": prompt}, 404),
                ("/tokenize", {"prompt": prompt}, 200),
                ("/v1/completions", {"prompt": prompt, "max_tokens": 10**309}, 400),
                ("/v1/completions", {"prompt": prompt, "max_tokens": 1e308}, 400),
                ("/v1/completions", {"prompt": prompt, "n": 10**9}, 400)):
            resp = http.post(path, content=json.dumps({"model": "tiny", **fields}),
                             headers={"content-type": "application/json"})
            assert resp.status_code == status, (path, fields, resp.text)
    wait_until(lambda: _outstanding(server) == 0, 30, "the routers to hold no request")


def test_choices_batches_logprobs_and_tokenizer_routes(server, oai):
    batch = oai.completions.create(model="tiny", prompt=["one prompt", "and another"], n=2,
                                   max_tokens=3, logprobs=1, extra_body={"min_tokens": 2})
    Completion.model_validate(batch.model_dump())
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.usage.completion_tokens == 12
    assert batch.usage.prompt_tokens == len("one prompt") + len("and another") + 2  # BOS
    for choice in batch.choices:  # the simulator's made-up distribution: 1/2, then 1/4
        assert choice.logprobs.token_logprobs == pytest.approx([-math.log(2)] * 3)
    chunks = list(oai.chat.completions.create(
        model="tiny", n=2, max_tokens=3, stream=True, logprobs=True, top_logprobs=2,
        stream_options={"include_usage": True}, messages=[{"role": "user", "content": "Hi"}]))
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk.model_dump())
    per_index = {0: 0, 1: 0}
    for chunk in chunks[:-1]:
        per_index[chunk.choices[0].index] += len(chunk.choices[0].logprobs.content)
    assert per_index == {0: 3, 1: 3} and chunks[-1].usage.completion_tokens == 6
    with server.client(headers={"Authorization": "Bearer key-a"}) as http:
        tokens = http.post("/tokenize", json={"prompt": "abc"}).json()
        assert tokens == {"count": 4, "max_model_len": tokens["max_model_len"],
                          "tokens": tokens["tokens"]}
        assert http.post("/detokenize", json={"tokens": tokens["tokens"][1:]}).json() == {
            "prompt": "abc"}
        assert http.get("/version").json() == {"version": kvroute_version()}
        assert http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "n": 129}
                         ).json()["error"]["param"] == "n"
    wait_until(lambda: _outstanding(server) == 0, 30,
               "the routed requests' (tokenize too) ends to reach their router")


def test_client_disconnect_aborts_the_request_at_the_engine(server):
    aborted = server.sum_metric("kvroute_engine_requests_finished_total", reason="abort")
    body = {"model": "tiny", "prompt": "Stream until I hang up.", "max_tokens": 200,
            "stream": True, "ignore_eos": True}
    with server.client(headers={"Authorization": "Bearer key-a"}) as http:
        with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            next(resp.iter_lines())  # one chunk arrives, then the client goes away
    wait_until(lambda: server.sum_metric("kvroute_engine_requests_finished_total",
                                         reason="abort") == aborted + 1,
               30, "the engine to abort the disconnected request")
    wait_until(lambda: _outstanding(server) == 0, 30, "the aborted request's end to reach "
                                                      "its router")


def test_metrics_endpoint_serves_every_process(server):
    names = {name for name, _ in server.metrics()}
    for name in ("kvroute_router_decision_seconds_bucket", "kvroute_gateway_requests_total",
                 "kvroute_engine_ttft_seconds_bucket", "kvroute_router_index_blocks"):
        assert name in names
    # vLLM's gauge names, one series per engine replica (llm-d's endpoint picker reads them)
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        assert set(server.by_label(name, "replica")) == set(server.replica_ids()), name
    # `?node=IP` (the chart's per-pod scrape) reaches the hub through the replica's server:
    # no process runs on a node of another address
    other = httpx.get(f"{server.base_url}/metrics", params={"node": "192.0.2.1"}, timeout=30)
    assert other.status_code == 200 and "kvroute_" not in other.text


def test_gateway_latency_histograms_observe_each_finished_request(server, oai):
    """The gateway-side TTFT, TPOT, e2e, queue and preprocess histograms (docs/metrics.md,
    "Gateway latency") each observe every finished request once, streamed or not."""
    assert_latency_histograms_count_each_request(server, oai)


@pytest.mark.parametrize("gateways", [1, 4])
def test_ingress_routers_hit_the_cache_as_one_does(server, tmp_path, gateways):
    """The module's server (two ingress routers, the default) and one with `gateways`
    routers, under the same shared-prefix traffic (shared_prefix_traffic.py): every one
    delivers the workload's bound, to the token, as one router does. Several routers also
    count each other's routed work: once the traffic has ended, each router's load on a
    replica is the work all of them routed there (recent work, decaying alike)."""
    headers = {"Authorization": "Bearer key-a"}
    # the module's server has run this traffic before (another parametrization): new groups
    two = traffic.send_groups(server, headers, first_group=10 * gateways)
    log = tmp_path / f"serve-{gateways}-routers.log"
    with kvroute_cli_server([*direct_flags(tmp_path), "--gateways", str(gateways)], 2,
                            log, routed_probe=headers) as other:
        # HAProxy can route a probe before the CLI has finished deploying, then reload and
        # pass requests unrouted for a moment: wait until the CLI reports the app up
        wait_until(lambda: "kvroute: up in" in log.read_text(), 120,
                   "kvroute serve to report the app up")
        groups = traffic.send_groups(other, headers)
        if gateways > 1:
            wait_until(lambda: _loads_agree(other), 30,
                       "every router's load to count the work all of them routed")
    routers = {a.router_id for g in groups for a in g} - {None}
    assert len(routers) == 1 if gateways == 1 else len(routers) > 1, routers
    assert len({a.router_id for g in two for a in g} - {None}) == 2  # both routers routed
    expected = [0] + [traffic.SYSTEM_TOKENS] * (traffic.PROMPTS_PER_GROUP - 1)
    for answers in (*two, *groups):
        assert [a.cached_tokens for a in answers] == expected, answers
    # Stated tolerance: none. Both deliver the workload's bound, to the token.
    assert traffic.hit_rate(groups) == traffic.hit_rate(two)


def _loads_agree(server) -> bool:
    """With no request outstanding, every router's load on each replica within 10% of the
    others' (the recent work decays 2.3% a second, and a router's gauges read through the
    metrics hub may be a few seconds older than another's). Each router counting only its
    own work would be far off: a group's first prompt (its whole prefill) is in the load of
    the router that routed it only. Routers that routed a prompt: Serve's proxy holds one
    too, which pushes its series (a load of 0) once it has served a GET, and routes none."""
    if _outstanding(server) != 0:
        return False
    routed = server.by_label("kvroute_router_decision_seconds_count", "gateway")
    loads: dict[str, list[float]] = {}
    for (name, labels), value in server.metrics().items():
        labels = dict(labels)
        if name == "kvroute_router_load_tokens" and routed.get(labels["gateway"], 0.0) > 0:
            loads.setdefault(labels["replica"], []).append(value)
    return bool(loads) and all(len(v) > 1 and min(v) >= 0.9 * max(v) > 0
                               for v in loads.values())


def test_a_killed_replica_leaves_the_survivor_serving(server, oai):
    before = set(server.replica_ids())
    server.kill_an_engine_replica()

    def forgotten() -> bool:  # /ready itself is answered by whichever replica is up
        try:
            return not before <= set(server.replica_ids())
        except (httpx.HTTPError, ValueError, KeyError):
            return False

    def serves() -> bool:
        try:
            return oai.completions.create(model="tiny", prompt="after the kill",
                                          max_tokens=1).usage.completion_tokens == 1
        except (openai.APIError, httpx.HTTPError):
            return False

    wait_until(forgotten, 60, "the index to forget the killed replica")
    (victim,) = before - set(server.replica_ids())

    def marked_down() -> bool:  # 0 in every router that routed to it, not removed
        up = server.by_label("kvroute_router_replica_up", "gateway", replica=victim)
        return bool(up) and set(up.values()) == {0.0}

    wait_until(marked_down, 60, "the routers to set the killed replica's replica_up to 0")
    wait_until(serves, 60, "requests to be served again")
    for i in range(6):
        assert oai.completions.create(model="tiny", prompt=f"still {i}",
                                      max_tokens=1).usage.completion_tokens == 1
