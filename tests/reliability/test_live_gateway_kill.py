"""Fault injection: a gateway killed under load. `kvroute serve --ingress gateway`
with 2 gateway replicas and 2 simulated engine replicas; bounded load on loopback (16
requests, half streamed, 8 at a time), and one gateway replica killed while they run.
Every request completes or fails clearly and promptly (an HTTP error status, an SSE error
event, or the connection closed under it), none hangs; Serve replaces the gateway, new
requests are served, and once idle the routers' outstanding load is back to zero."""

import concurrent.futures
import json

import httpx
import pytest
import ray

from router.cli import APP_NAME
from tests.router.serve.serve_helpers import kvroute_server, wait_until

pytestmark = pytest.mark.slow

SHARED = "Shared system prompt of the gateway kill test. " * 6
MAX_TOKENS = 200
NUM_REQUESTS = 16
REQUEST_TIMEOUT_S = 120.0  # far beyond any request here: reaching it is a hang


@pytest.fixture(scope="module")
def server():
    args = {"model": "tiny", "replicas": 2, "gateways": 2, "engine": "sim",
            "sim_preset": "h100-llama3-8b", "policy": "cache_aware", "num_blocks": 128,
            "cpus_per_rank": 0.25}
    with kvroute_server(args) as srv:
        yield srv


def send(base_url: str, i: int) -> str:
    """"ok", or how the request failed clearly; raises on a hang (the client's timeout)."""
    stream = i % 2 == 0
    body = {"model": "tiny", "prompt": SHARED + f"gateway kill {i}", "max_tokens": MAX_TOKENS,
            "stream": stream, "ignore_eos": True}
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)
    try:
        with httpx.Client(base_url=base_url, timeout=timeout) as http:
            if not stream:
                resp = http.post("/v1/completions", json=body)
                if resp.status_code == 200:
                    assert resp.json()["usage"]["completion_tokens"] == MAX_TOKENS
                    return "ok"
                assert resp.status_code >= 500 and resp.content, resp
                return f"status {resp.status_code}"
            with http.stream("POST", "/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    assert resp.status_code >= 500 and resp.read(), resp
                    return f"status {resp.status_code}"
                events = [line.removeprefix("data: ") for line in resp.iter_lines()
                          if line.startswith("data: ")]
        if events[-1] == "[DONE]":
            return "ok"
        error = json.loads(events[-1])["error"]  # an error event ends the stream
        assert error["code"] and error["message"]
        return "error event"
    except (httpx.RemoteProtocolError, httpx.ReadError) as err:  # the connection was cut
        return f"cut: {type(err).__name__}"


def gateway_actor_names() -> list[str]:
    prefix = f"SERVE_REPLICA::{APP_NAME}#Gateway#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith(prefix))


def test_kill_a_gateway_under_load(server):
    gateways = wait_until(lambda: (lambda g: g if len(g) == 2 else None)(
        gateway_actor_names()), 60, "two gateway replicas")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(send, server.base_url, i) for i in range(NUM_REQUESTS)]
        wait_until(lambda: server.sum_metric("kvroute_engine_requests", state="running") > 0,
                   60, "requests running on the engines")
        victim = gateways[0]
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        outcomes = [f.result(timeout=REQUEST_TIMEOUT_S + 30) for f in futures]  # no hang
    print("gateway kill outcomes:", {o: outcomes.count(o) for o in set(outcomes)})
    assert len(outcomes) == NUM_REQUESTS and outcomes.count("ok") >= NUM_REQUESTS // 2

    # Serve replaces the gateway; requests are served again.
    wait_until(lambda: (lambda g: g if len(g) == 2 and victim not in g else None)(
        gateway_actor_names()), 120, "Serve to replace the killed gateway")
    for i in range(4):
        assert send(server.base_url, 100 + i) == "ok"

    def idle() -> bool:
        outstanding = server.by_label("kvroute_router_outstanding_requests", "replica")
        return bool(outstanding) and sum(outstanding.values()) == 0

    wait_until(idle, 30, "the routers' outstanding load to return to zero")
