"""`kvroute serve` end to end on real Ray Serve: 2 replicas of the real `tiny` model, each
tensor-parallel over 2 ranks (rank 1 a Ray actor in the replica's placement group, gloo).

The official openai client, cache affinity and cached_tokens, tenants, pinned prefixes,
client disconnects, and every kind of bad input (4xx, never 5xx, and the server goes on).
"""

import json
import math
import os
import time

import httpx
import openai
import pytest
import ray
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from tests.router.serve.serve_helpers import (
    DELIVERED,
    PREDICTED,
    SERIES_LABELS,
    assert_latency_histograms_count_each_request,
    assert_model_list,
    kvroute_server,
    prometheus_scraping,
    promql,
    wait_until,
)
from worker.openai.tokenize import kvroute_version

pytestmark = pytest.mark.slow

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
ADMIN_KEY = "admin-key"  # pins are an admin operation (router/front/pin_admin.py)
ADMIN_FOR_A = {"Authorization": f"Bearer {ADMIN_KEY}", "X-Kvroute-Tenant": "tenant-a"}
# ~40 blocks of 16 tokens shared by every affinity request; the byte tokenizer is 1 token/byte
SHARED = "You are a meticulous assistant. Answer briefly and cite sources. " * 10


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    os.environ["KVROUTE_ADMIN_KEY"] = ADMIN_KEY  # a local Ray passes it to every process
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    args = {"model": "tiny", "replicas": 2, "tp": 2, "engine": "real", "policy": "cache_aware",
            "num_blocks": 256, "api_keys_file": str(keys_file), "cpus_per_rank": 0.5}
    try:
        with kvroute_server(args) as srv:
            yield srv
    finally:
        del os.environ["KVROUTE_ADMIN_KEY"]


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    """Scraping from before the first request, so every counter's first sample is 0."""
    with prometheus_scraping(server.base_url.removeprefix("http://"),
                             tmp_path_factory.mktemp("prometheus")) as url:
        for name in ("kvroute_engine_prefix_cache_query_tokens_total",
                     "kvroute_router_prompt_tokens_total"):
            # one series per replica and, for the routers' counters, per router process
            wait_until(lambda n=name: len(promql(url, f"sum by (replica) ({n})")) == 2, 60,
                       f"Prometheus to scrape {name} of both replicas")
        yield url


@pytest.fixture(scope="module")
def oai(server, prometheus):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="key-a", timeout=60,
                         max_retries=0)


def test_openai_client_completions_and_chat(server, oai):
    models = oai.models.list()
    assert [m.id for m in models.data] == ["tiny"]
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
    # Greedy: the streamed text is the non-streamed text.
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.choices[0].text

    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    chat = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 4
    # <s> <|system|>\nBe terse.<|end|>\n <|user|>\nHi<|end|>\n <|assistant|>\n
    assert chat.usage.prompt_tokens == 1 + (1 + 1 + 9 + 1 + 1) + (1 + 1 + 2 + 1 + 1) + 2

    stream = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                         temperature=0, stream=True,
                                         extra_body={"ignore_eos": True})
    parts = list(stream)
    assert parts[0].choices[0].delta.role == "assistant"
    assert parts[-1].choices[0].finish_reason == "length"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == \
        chat.choices[0].message.content


def test_shared_prefix_lands_on_the_replica_that_holds_it(server, oai):
    before = server.by_label("kvroute_router_requests_total", "replica")
    predicted_before = server.sum_metric("kvroute_router_predicted_hit_tokens_total")
    cached = []
    for i in range(5):
        c = oai.completions.create(model="tiny", prompt=SHARED + f"Question {i}?",
                                   max_tokens=2, temperature=0)
        cached.append(c.usage.prompt_tokens_details.cached_tokens)

    # Each replica caches on its own: every later request hitting the shared prefix is the
    # proof that all five went to the replica that holds it.
    assert cached[0] == 0
    shared_blocks_tokens = (len(SHARED) + 1) // 16 * 16
    assert all(c >= shared_blocks_tokens for c in cached[1:])

    def routed() -> list[float] | None:
        """Routed per replica since `before`, once one replica's count includes all five
        (each ingress router pushes its own series to the hub every second; a push of
        earlier decisions can land after `before` was read, hence >=)."""
        after = server.by_label("kvroute_router_requests_total", "replica")
        counts = sorted(after.get(r, 0) - before.get(r, 0) for r in after)
        return counts if counts and counts[-1] >= 5 else None

    wait_until(routed, 30, "one replica's routed count to include all five decisions")
    predicted = server.sum_metric("kvroute_router_predicted_hit_tokens_total")
    assert predicted - predicted_before >= sum(cached)


def test_tenants_never_share_cache(server):
    prompt = "Tenant isolation check: " + "abcdefgh" * 8
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    with server.client() as http:
        a1 = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer key-a"})
        a2 = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer key-a"})
        b1 = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer key-b"})
    cached = [r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (a1, a2, b1)]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0


def test_pinned_prefix_register_list_use_delete(server):
    auth = {"Authorization": "Bearer key-a"}
    system = "Pinned system prompt for the support desk. " * 4
    with server.client(headers=auth) as http:
        refused = http.post("/v1/prefixes", json={"name": "support", "prompt": system})
        assert refused.status_code == 403, refused.text  # a tenant key may not pin
        reg = http.post("/v1/prefixes", json={"name": "support", "prompt": system},
                        headers=ADMIN_FOR_A)
        assert reg.status_code == 200, reg.text
        info = reg.json()
        assert info["num_pinned_blocks"] == (len(system) + 1) // 16
        assert info["replica"] in server.replica_ids()
        assert [p["name"] for p in http.get("/v1/prefixes").json()["data"]] == ["support"]
        # Another tenant sees none of it.
        other = http.get("/v1/prefixes", headers={"Authorization": "Bearer key-b"}).json()
        assert other["data"] == []
        use = http.post("/v1/completions", json={"model": "tiny", "prompt": system + "Hi",
                                                 "max_tokens": 1})
        assert use.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == \
            info["num_pinned_blocks"] * 16
        assert http.delete("/v1/prefixes/support").status_code == 403
        assert http.delete("/v1/prefixes/support",
                           headers=ADMIN_FOR_A).json()["deleted"] is True
        assert http.get("/v1/prefixes").json()["data"] == []
        gone = http.delete("/v1/prefixes/support", headers=ADMIN_FOR_A)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "prefix_not_found"


def test_client_disconnect_aborts_the_request_at_the_engine(server):
    aborted = server.sum_metric("kvroute_engine_requests_finished_total", reason="abort")
    body = {"model": "tiny", "prompt": "Stream until I hang up.", "max_tokens": 1500,
            "stream": True, "ignore_eos": True}
    with server.client(headers={"Authorization": "Bearer key-a"}) as http:
        with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            next(resp.iter_lines())  # one chunk arrives, then the client goes away
    wait_until(lambda: server.sum_metric("kvroute_engine_requests_finished_total",
                                         reason="abort") == aborted + 1,
               30, "the engine to abort the disconnected request")


BAD_REQUESTS = [
    # (path, headers, raw body, status, error code)
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": ', 400, "invalid_json"),
    ("/v1/completions", {}, b'["not", "an", "object"]', 400, "invalid_json"),
    ("/v1/completions", {}, b'{"model": "gpt-9", "prompt": "x"}', 404, "model_not_found"),
    ("/v1/completions", {}, b'{"prompt": "x"}', 400, "missing_required_parameter"),
    ("/v1/chat/completions", {}, b'{"model": "tiny"}', 400, "missing_required_parameter"),
    ("/v1/chat/completions", {}, b'{"model": "tiny", "messages": []}', 400, "invalid_value"),
    ("/v1/chat/completions", {}, b'{"model": "tiny", "messages": [{"role": "robot", '
                                 b'"content": "x"}]}', 400, "invalid_value"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": "x", "max_tokens": "5"}', 400,
     "invalid_value"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": "x", "max_tokens": 0}', 400,
     "invalid_value"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": "x", "temperature": -1}', 400,
     "invalid_value"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": "x", "top_p": 1.5}', 400,
     "invalid_value"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": "x", "n": 129}', 400,
     "invalid_value"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": ["x", [1]]}', 400, "invalid_value"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": []}', 400, "invalid_value"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": "x", "stream": "yes"}', 400,
     "invalid_value"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": ""}', 400, "invalid_value"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": [1, 2, 99999]}', 400,
     "invalid_request"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": [1, 99999999999]}', 400,
     "invalid_value"),
    ("/v1/completions", {}, json.dumps({"model": "tiny", "prompt": "y" * 5000}).encode(), 400,
     "context_length_exceeded"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": "x", "max_tokens": 100000}', 400,
     "context_length_exceeded"),
    ("/v1/completions", {"Authorization": "Bearer wrong"}, b'{"model": "tiny", "prompt": "x"}',
     401, "invalid_api_key"),
    ("/v1/completions", {"Authorization": ""}, b'{"model": "tiny", "prompt": "x"}', 401,
     "invalid_api_key"),
    ("/v1/prefixes", ADMIN_FOR_A, b'{"name": "bad name!", "prompt": "x"}', 400,
     "invalid_value"),
    ("/v1/prefixes", ADMIN_FOR_A, b'{"name": "short", "prompt": "too short"}', 400,
     "invalid_request"),
    ("/v1/prefixes", {}, b'{"name": "short", "prompt": "too short"}', 403, "not_admin"),
    ("/v1/completions", {}, b"[" * 5000 + b"]" * 5000, 400, "invalid_json"),
    ("/v1/completions", {}, b'{"model": "tiny", "prompt": "x", "stop": ["' + b"s" * 300
     + b'"]}', 400, "invalid_value"),
    ("/v1/nope", {}, b"{}", 404, "not_found"),
]


@pytest.mark.parametrize("path,headers,raw,status,code", BAD_REQUESTS)
def test_bad_input_is_a_4xx_with_an_openai_error_body(server, path, headers, raw, status, code):
    sent = {"Authorization": "Bearer key-a", "Content-Type": "application/json", **headers}
    with server.client() as http:
        resp = http.post(path, content=raw, headers=sent)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_server_keeps_serving_after_bad_input(server, oai):
    with server.client() as http:
        statuses = server.by_label("kvroute_gateway_requests_total", "status")
        assert not any(s.startswith("5") for s in statuses), statuses
        assert http.get("/health").json() == {"status": "ok"}
    c = oai.completions.create(model="tiny", prompt="still alive?", max_tokens=1)
    assert c.usage.completion_tokens == 1


def test_choices_batches_logprobs_and_tokenizer_routes(server, oai):
    """The gateway's n, batches and logprobs on the real model (greedy: a choice's text
    tells its prompt), whole and streamed, as the openai package's types."""
    greedy = {"temperature": 0, "extra_body": {"ignore_eos": True}}
    batch = ["The gateway routes", "each prompt of a batch"]
    alone = [oai.completions.create(model="tiny", prompt=p, max_tokens=4, **greedy)
             .choices[0].text for p in batch]
    out = oai.completions.create(model="tiny", prompt=batch, n=2, max_tokens=4, logprobs=2,
                                 **greedy)
    Completion.model_validate(out.model_dump())
    assert [c.text for c in out.choices] == [alone[0], alone[0], alone[1], alone[1]]
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 16
    for choice in out.choices:
        lp = choice.logprobs
        assert len(lp.tokens) == 4
        assert all(top[t] == v == max(top.values())
                   for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))
    messages = [{"role": "user", "content": "Stream two answers"}]
    whole = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=3, n=2,
                                        **greedy)
    chunks = list(oai.chat.completions.create(model="tiny", messages=messages, max_tokens=3,
                                              n=2, stream=True, **greedy))
    texts = {0: "", 1: ""}
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk.model_dump())
        texts[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices]
    with server.client(headers={"Authorization": "Bearer key-a"}) as http:
        tokens = http.post("/tokenize", json={"prompt": "abc"}).json()
        assert (tokens["count"], tokens["max_model_len"]) == (4, 2048)
        assert http.post("/detokenize", json={"tokens": tokens["tokens"][1:]}).json() == {
            "prompt": "abc"}
        assert http.get("/version").json() == {"version": kvroute_version()}
        bad = http.post("/v1/chat/completions", json={"model": "tiny", "messages": messages,
                                                      "top_logprobs": 30, "logprobs": True})
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "top_logprobs")


def test_prometheus_hit_rate_queries_return_what_the_engine_reports(server, prometheus):
    """docs/metrics.md's PromQL over a real Prometheus scrape equals the counters' ratios."""
    names = ("kvroute_engine_prefix_cache_hit_tokens_total",
             "kvroute_engine_prefix_cache_query_tokens_total",
             "kvroute_router_predicted_hit_tokens_total", "kvroute_router_prompt_tokens_total")

    def key(labels) -> tuple:
        return tuple(sorted((k, v) for k, v in labels if k in SERIES_LABELS))

    def scraped_is(now: dict, at: float) -> bool:
        """Prometheus's last samples at `at` are `now`, and some traffic was counted."""
        for name in names:
            seen = {key(ls): v for ls, v in promql(prometheus, name, at).items()}
            want = {key(ls): v for (n, ls), v in now.items() if n == name}
            if seen != want or not any(want.values()):
                return False
        return True

    def first_samples(name: str, at: float) -> dict[tuple, float]:
        """Each series' oldest sample in the 5m window ending at `at`: rate() counts from there."""
        resp = httpx.get(f"{prometheus}/api/v1/query",
                         params={"query": f"{name}[5m]", "time": f"{at:.3f}"}, timeout=10)
        return {key(r["metric"].items()): float(r["values"][0][1])
                for r in resp.json()["data"]["result"]}

    def ratio(now: dict, at: float, num: str, den: str) -> dict[str, float]:
        """Per replica, what the counters grew by over the window: increase(num) /
        increase(den), from the engine's own final values and the window's first sample."""
        first = {name: first_samples(name, at) for name in (num, den)}
        sums: dict[str, list[float]] = {}
        for (name, labels), value in now.items():
            replica = dict(labels).get("replica")
            if name in (num, den) and replica:
                grown = value - first[name].get(key(labels), 0.0)
                sums.setdefault(replica, [0.0, 0.0])[name == den] += grown
        return {r: n / d for r, (n, d) in sums.items() if d}

    def per_replica(query: str, at: float) -> dict[str, float]:
        return {dict(ls)["replica"]: v for ls, v in promql(prometheus, query, at).items()
                if not math.isnan(v)}  # 0/0: a replica that got no traffic

    def compared() -> tuple | None:
        """Every query evaluated at one instant, whose last scrape holds the counters read
        here: a request that ends meanwhile (an earlier test's) or a window sliding past a
        sample would otherwise move one side of the comparison only."""
        at = time.time()
        now = server.metrics()
        if not scraped_is(now, at):
            return None
        got = (per_replica(DELIVERED, at),
               ratio(now, at, "kvroute_engine_prefix_cache_hit_tokens_total",
                     "kvroute_engine_prefix_cache_query_tokens_total"),
               per_replica(PREDICTED, at),
               ratio(now, at, "kvroute_router_predicted_hit_tokens_total",
                     "kvroute_router_prompt_tokens_total"))
        # A scrape stamped before `at` but stored after the check above would change the
        # queries' view of `at`: only an unchanged view is compared.
        return got if scraped_is(now, at) else None

    delivered, engine, predicted, router = wait_until(
        compared, 30, "Prometheus to scrape the final counters")
    assert delivered == pytest.approx(engine, rel=1e-9)
    assert any(v > 0 for v in delivered.values())
    assert predicted == pytest.approx(router, rel=1e-9)


def test_metrics_endpoint_serves_every_process(server):
    metrics = server.metrics()
    names = {name for name, _ in metrics}
    for replica in server.replica_ids():
        assert ("kvroute_engine_prompt_tokens_total",
                (("model", "tiny"), ("replica", replica))) in metrics
    for name in ("kvroute_router_decision_seconds_bucket", "kvroute_gateway_requests_total",
                 "kvroute_router_index_blocks", "kvroute_engine_ttft_seconds_bucket"):
        assert name in names


def test_metrics_of_one_node_are_the_series_of_the_processes_on_it(server):
    """`/metrics?node=IP` (the chart's per-pod scrape): this one-node cluster's node holds
    every process; another address holds none."""
    samples = {}
    for node in (ray.util.get_node_ip_address(), "192.0.2.1"):
        text = httpx.get(f"{server.base_url}/metrics", params={"node": node}, timeout=30).text
        samples[node] = {s.name for fam in text_string_to_metric_families(text)
                         for s in fam.samples}
    assert {"kvroute_engine_prompt_tokens_total", "kvroute_router_index_blocks",
            "kvroute_gateway_requests_total"} <= samples[ray.util.get_node_ip_address()]
    assert samples["192.0.2.1"] == set()


def test_gateway_latency_histograms_observe_each_finished_request(server, oai):
    """The gateway-side TTFT, TPOT, e2e, queue and preprocess histograms (docs/metrics.md,
    "Gateway latency") each observe every finished request once, streamed or not."""
    assert_latency_histograms_count_each_request(server, oai)
