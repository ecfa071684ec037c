"""RouterMetrics: a lost replica's replica_up reads 0 (KvrouteReplicaDown can fire), then
leaves after its TTL; a replica that comes back reads 1."""

from prometheus_client import generate_latest

from router.core.ledger import RouteKind, RouteRecord, RouteState
from router.front.router_metrics import RouterMetrics


def up(metrics: RouterMetrics, replica_id: str) -> float | None:
    return metrics.registry.get_sample_value("kvroute_router_replica_up",
                                             {"gateway": "g0", "replica": replica_id})


def test_a_lost_replica_reads_0_until_its_ttl_then_leaves():
    metrics = RouterMetrics("tiny", "g0", "cache_aware", down_series_ttl_s=600.0)
    metrics.add_replica("r1")
    metrics.add_replica("r2")
    assert (up(metrics, "r1"), up(metrics, "r2")) == (1.0, 1.0)
    metrics.remove_replica("r1", now_s=1000.0)
    assert up(metrics, "r1") == 0.0
    # its routing series are gone at once; the survivor's stay
    text = generate_latest(metrics.registry).decode()
    assert 'kvroute_router_requests_total{gateway="g0",model="tiny",policy="cache_aware",' \
           'replica="r1"}' not in text
    assert 'replica="r2"' in text
    metrics.drop_expired(now_s=1600.0)  # exactly the TTL: still down
    assert up(metrics, "r1") == 0.0
    metrics.drop_expired(now_s=1600.5)
    assert up(metrics, "r1") is None and up(metrics, "r2") == 1.0


def test_a_replica_that_comes_back_reads_1_and_is_not_expired():
    metrics = RouterMetrics("tiny", "g0", "cache_aware", down_series_ttl_s=600.0)
    metrics.add_replica("w1")
    metrics.remove_replica("w1", now_s=0.0)
    metrics.add_replica("w1")  # an external worker back up, under its same id
    metrics.drop_expired(now_s=10_000.0)
    assert up(metrics, "w1") == 1.0


def test_shared_decisions_follow_the_mirrors_totals_and_each_refresh_counts():
    metrics = RouterMetrics("tiny", "g0", "cache_aware")

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"gateway": "g0", **labels})

    assert sample("kvroute_router_shared_decisions_total", direction="sent") == 0.0
    metrics.set_shared_decisions(sent=3, received=5)
    metrics.set_shared_decisions(sent=4, received=5)
    assert sample("kvroute_router_shared_decisions_total", direction="sent") == 4.0
    assert sample("kvroute_router_shared_decisions_total", direction="received") == 5.0
    assert sample("kvroute_router_series_refreshes_total") == 2.0


def test_a_replica_back_after_its_removal_counts_on_its_new_series():
    """The children a request moves are kept between requests: a removed replica's go with
    its series, so what it routes when it is back shows up."""
    metrics = RouterMetrics("tiny", "g0", "cache_aware")
    record = RouteRecord("r1", RouteKind.DIRECT, RouteState.ROUTED, 0.0, (), (), 32, 1,
                         (16, 0), 1e-4)
    metrics.add_replica("r1")
    metrics.observe_routed(record)
    metrics.set_outstanding("r1", 1)
    metrics.remove_replica("r1", now_s=0.0)
    metrics.add_replica("r1")
    metrics.observe_routed(record)
    metrics.set_outstanding("r1", 2)
    labels = {"model": "tiny", "gateway": "g0", "policy": "cache_aware", "replica": "r1"}
    get = metrics.registry.get_sample_value
    assert get("kvroute_router_requests_total", labels) == 1.0
    assert get("kvroute_router_prompt_tokens_total", labels) == 32.0
    assert get("kvroute_router_predicted_hit_tokens_total", {**labels, "medium": "device"}) == 16
    assert get("kvroute_router_outstanding_requests", {"gateway": "g0", "replica": "r1"}) == 2
