"""Fault injection on a live `kvroute serve --engine sim` with 4 replicas, under
bounded load on loopback: a replica is killed and the KV index actor restarted while
requests run. Afterwards every accepted request has completed or failed with a clear error
(none hangs), the routers' index equals the replicas' contents within 5 s, and once idle
the routers' outstanding load is back to zero."""

import concurrent.futures
import json

import pytest
import ray

from router.cli import APP_NAME
from router.cluster.index_actor import INDEX_ACTOR_NAME
from tests.router.serve.serve_helpers import kvroute_server, wait_until
from tests.router.serve.test_serve_failover import _call, _complete, _truth

pytestmark = pytest.mark.slow

SHARED = "Shared system prompt of the live fault tests. " * 6
MAX_TOKENS = 200
NUM_REQUESTS = 16


@pytest.fixture(scope="module")
def server():
    args = {"model": "tiny", "replicas": 4, "engine": "sim", "policy": "cache_aware",
            "num_blocks": 128, "cpus_per_rank": 0.25}
    with kvroute_server(args) as srv:
        yield srv


def clear_outcome(result: dict) -> str:
    """"ok", or "failed" for a clear error; anything else fails the test."""
    if result["status"] == 200 and "body" in result:
        assert result["body"]["usage"]["completion_tokens"] == MAX_TOKENS
        return "ok"
    if result["status"] == 200:
        events = result["events"]
        if events[-1] == "[DONE]":
            return "ok"
        error = json.loads(events[-1])["error"]
        assert error["code"] and error["message"]
        return "failed"
    assert result["status"] in (429, 503), result
    assert result["body"]["error"]["code"]
    return "failed"


def test_kill_a_replica_and_restart_the_index_under_load(server):
    index = ray.get_actor(INDEX_ACTOR_NAME, namespace="kvroute")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_complete, server, SHARED + f"live {i}", MAX_TOKENS, i % 2 == 0)
                   for i in range(NUM_REQUESTS)]

        def busy_replica() -> str | None:  # cache_aware keeps the shared prefix together
            running = server.by_label("kvroute_engine_requests", "replica", state="running")
            return max(running, key=running.get) if any(running.values()) else None

        victim = wait_until(busy_replica, 60, "requests running on some replica")
        ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#EngineReplica#{victim}",
                               namespace="serve"), no_restart=True)
        before = _call(index.get_incarnation)
        ray.kill(index, no_restart=False)
        wait_until(lambda: _call(index.get_incarnation) not in (None, before), 60,
                   "Ray to restart the index actor")
        results = [f.result(timeout=180) for f in futures]  # none hangs
    outcomes = [clear_outcome(r) for r in results]
    assert len(outcomes) == NUM_REQUESTS and outcomes.count("ok") >= NUM_REQUESTS // 2

    # Serve replaces the victim; once the replica set is stable, every router's view
    # equals the replicas' true contents within 5 s.
    replica_ids = wait_until(lambda: (lambda ids: ids if len(ids) == 4 and victim not in ids
                                      else None)(server.replica_ids()),
                             180, "Serve to replace the killed replica")
    def views_match() -> bool:
        # Asked again each time: the test's own handle may not route to the newcomer yet
        # (its digest is None until it does).
        truth = _truth(replica_ids)
        views = _call(index.router_views)
        return (None not in truth.values() and bool(views)
                and all(v == truth for v in views.values()))

    wait_until(lambda: None not in _truth(replica_ids).values(), 60,
               "the test's handle to reach every replica")
    wait_until(views_match, 5, "every router's index to equal the replicas' contents")

    def idle() -> bool:
        outstanding = server.by_label("kvroute_router_outstanding_requests", "replica")
        return sum(outstanding.values()) == 0

    wait_until(idle, 30, "the routers' outstanding load to return to zero")
