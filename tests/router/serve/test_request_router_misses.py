"""The gateway ingress's miss causes: a Serve call ends with no word of what its engine
found cached, so the request router counts the causes its decision knew (no race). Real
Serve types, no Ray cluster, as tests/router/serve/test_request_router_bookkeeping.py."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.router.serve.test_request_router_bookkeeping import make_router, pending, replica


def misses(router) -> dict[str, float]:
    text = generate_latest(router.metrics.registry).decode()
    return {s.labels["cause"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "kvroute_miss_tokens_total" and s.value}


async def test_each_ended_call_counts_the_causes_its_decision_knew():
    router = make_router()
    candidates = [replica("a"), replica("b")]
    [first], [_] = await router.choose_replicas(candidates, pending("q1"))
    router.on_request_completed(first.replica_id, "q1")
    assert misses(router) == {"cold": 64}  # 4 blocks nobody saw
    # the same prompt follows its pending marks: all 4 blocks predicted, the last token
    # computed all the same
    [second], [_] = await router.choose_replicas(candidates, pending("q2"))
    assert second.replica_id == first.replica_id
    router.on_request_completed(second.replica_id, "q2")
    router.on_request_completed(second.replica_id, "q2")  # a late repeat counts nothing
    assert misses(router) == {"cold": 65}


async def test_a_retried_request_counts_its_misses_once():
    router = make_router()
    candidates = [replica("a"), replica("b")]
    [first], [_] = await router.choose_replicas(candidates, pending("q1"))
    router.on_request_completed(first.replica_id, "q1")  # the replica rejected it
    [again], [_] = await router.choose_replicas(candidates, pending("q1"))  # Serve's retry
    router.on_request_completed(again.replica_id, "q1")
    assert misses(router) == {"cold": 64}
