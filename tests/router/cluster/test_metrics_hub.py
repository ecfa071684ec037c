"""The metrics hub's merge: one family per name, per-process series kept, shared ones summed."""

from dataclasses import replace

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from router.cluster.metrics_hub import MetricsHub, exposition, merge_families


def _process(replica: str, hits: float, requests: float) -> list:
    r = CollectorRegistry()
    Counter("kvroute_engine_prefix_cache_hit_tokens", "d", ["replica"],
            registry=r).labels(replica).inc(hits)
    Counter("kvroute_gateway_requests", "d", ["status"], registry=r).labels("200").inc(requests)
    Histogram("kvroute_engine_ttft_seconds", "d", registry=r, buckets=(1.0,)).observe(0.5)
    return list(r.collect())


def _values(text: bytes) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text.decode())
            for s in fam.samples if not s.name.endswith("_created")}


def test_merge_keeps_per_replica_series_and_sums_shared_ones():
    text = exposition(merge_families([_process("a", 3, 1), _process("b", 5, 2)]))
    values = _values(text)
    assert values[("kvroute_engine_prefix_cache_hit_tokens_total", (("replica", "a"),))] == 3
    assert values[("kvroute_engine_prefix_cache_hit_tokens_total", (("replica", "b"),))] == 5
    assert values[("kvroute_gateway_requests_total", (("status", "200"),))] == 3
    assert values[("kvroute_engine_ttft_seconds_count", ())] == 2
    assert values[("kvroute_engine_ttft_seconds_bucket", (("le", "1.0"),))] == 2
    assert text.decode().count("# TYPE kvroute_engine_prefix_cache_hit_tokens_total") == 1


def test_hub_drops_a_source_that_stopped_pushing():
    hub = MetricsHub()
    hub.push("engine/a", _process("a", 1, 0))
    hub.push("engine/b", _process("b", 1, 0))
    snap = hub._snapshots["engine/a"]
    hub._snapshots["engine/a"] = replace(snap, pushed_at_s=snap.pushed_at_s - 10.0)  # 10 s ago
    assert hub.live_sources() == ["engine/b"]
    assert 'replica="a"' not in hub.exposition().decode()


def test_exposition_of_one_node_holds_only_the_processes_pushed_from_it():
    hub = MetricsHub()
    hub.push("engine/a", _process("a", 3, 1), node_ip="10.0.0.1")
    hub.push("engine/b", _process("b", 5, 2), node_ip="10.0.0.2")
    hub.push("gateway/g", _process("g", 0, 4), node_ip="10.0.0.1")
    node1 = _values(hub.exposition("10.0.0.1"))
    assert node1[("kvroute_engine_prefix_cache_hit_tokens_total", (("replica", "a"),))] == 3
    assert ("kvroute_engine_prefix_cache_hit_tokens_total", (("replica", "b"),)) not in node1
    assert node1[("kvroute_gateway_requests_total", (("status", "200"),))] == 5
    assert _values(hub.exposition("10.0.0.2"))[
        ("kvroute_gateway_requests_total", (("status", "200"),))] == 2
    assert _values(hub.exposition("10.0.0.9")) == {}
    assert _values(hub.exposition())[("kvroute_gateway_requests_total", (("status", "200"),))] == 7
