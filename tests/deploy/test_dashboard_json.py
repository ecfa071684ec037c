"""dashboards/kvroute.json read statically: datasource variable, units, descriptions, rates of
counters over $__rate_interval, and only series the metrics contract defines."""

import re

from dashboards.panels import DASHBOARD_PATH, iter_panels, load_dashboard, panel_queries

from .metrics_contract import contract_types

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
METRIC = re.compile(r"\bkvroute_\w+")
RATED = re.compile(r"(\{[^}]*\})?\[\$__rate_interval\]\)")


def test_variables_are_datasource_model_and_replica():
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    assert list(variables) == ["datasource", "model", "replica"]
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == (
        "datasource", "prometheus")
    for name in ("model", "replica"):
        variable = variables[name]
        assert variable["type"] == "query"
        assert variable["datasource"] == DATASOURCE
        assert (variable["includeAll"], variable["multi"], variable["allValue"]) == (
            True, True, ".*")
        assert variable["query"]["query"].startswith("label_values(kvroute_engine_")


def test_every_panel_has_datasource_unit_description_and_queries():
    panels = list(iter_panels(load_dashboard()))
    assert len({panel["id"] for panel in panels}) == len(panels)
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert len(panel["description"]) >= 40, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


def test_no_exported_datasource_uids():
    text = DASHBOARD_PATH.read_text()
    assert "__inputs" not in text and "__requires" not in text
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', text))
    assert uids == {"kvroute", "${datasource}", "-- Grafana --"}  # dashboard, panels, built-in


def test_counters_are_rated_over_the_rate_interval_and_gauges_are_not():
    """No lifetime averages: every counter and histogram series sits in
    rate(...[$__rate_interval]); a gauge is read as it is."""
    types = contract_types()
    for query in panel_queries(load_dashboard()):
        for match in METRIC.finditer(query.expr):
            name = match.group()
            assert name in types, f"{query.panel_title}: {name} is not in docs/metrics.md"
            rated = (query.expr[:match.start()].endswith("rate(")
                     and RATED.match(query.expr, match.end()) is not None)
            assert rated == (types[name] != "gauge"), f"{query.panel_title}: {name}"
            if name.endswith("_bucket"):
                assert query.expr.startswith("histogram_quantile("), query.panel_title


def test_no_fixed_windows():
    for query in panel_queries(load_dashboard()):
        assert re.findall(r"\[(\d+[smhd])\]", query.expr) == [], query.panel_title


def test_dashboard_covers_cache_routing_latency_and_capacity():
    titles = {panel["title"] for panel in iter_panels(load_dashboard())}
    assert titles >= {
        "Prefix cache hit rate: predicted vs delivered",
        "Delivered hit rate per replica",
        "Predicted hit rate per replica",
        "Hit rate by medium: predicted vs delivered",
        "Routing decisions per replica",
        "Load share per replica",
        "Routing decision latency",
        "Approximate-mode fallbacks",
        "Time to first token",
        "Gateway time to first token",
        "Gateway time per output token",
        "Gateway end-to-end latency",
        "Queue and preprocess time",
        "Time per output token",
        "End-to-end request latency",
        "KV block usage per replica",
        "Evictions by medium",
        "Preemptions per replica",
        "Queue lengths per replica",
        "Hit ladder: infinite memory, pooled at capacity, routed, delivered",
        "Hits lost at each step: capacity, routing, prediction",
        "Miss causes: uncached prompt tokens by cause",
        "Miss-ratio curve: pooled hit ratio by KV capacity",
    }
    rows = [panel["title"] for panel in load_dashboard()["panels"] if panel["type"] == "row"]
    assert rows == ["Cache", "Routing", "Latency and traffic", "Capacity", "Gateway latency",
                    "Where the hits go"]

