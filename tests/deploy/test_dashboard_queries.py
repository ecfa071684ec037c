"""Every panel query of dashboards/kvroute.json against a real Prometheus.

Parsing: a Prometheus with no targets must accept each query with its variables filled in.
Data: `kvroute serve --engine sim --replicas 2` runs, a real Prometheus scrapes its /metrics
every second, a shared-prefix load goes through /v1/completions, and then each query must
return at least one series and no NaN, except panels documented as showing only failures.
"""

import math
import re

import pytest

from dashboards.live import (
    KvrouteSim,
    Prometheus,
    PrometheusError,
    send_completions,
    shared_prefix_prompts,
    wait_until,
)
from dashboards.panels import ALL_SELECTED, load_dashboard, panel_queries, substitute

QUERIES = panel_queries(load_dashboard())
QUERY_IDS = [f"{q.panel_title} [{q.ref_id}]" for q in QUERIES]
NUM_PREFIXES = 4
REQUESTS_PER_PREFIX = 6
NUM_REQUESTS = NUM_PREFIXES * REQUESTS_PER_PREFIX
LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$")  # Grafana's variable query


@pytest.fixture(scope="module")
def empty_prometheus(prometheus_bin, tmp_path_factory):
    prometheus = Prometheus(prometheus_bin, tmp_path_factory.mktemp("prometheus-empty"), [])
    try:
        prometheus.wait_ready()
        yield prometheus
    finally:
        prometheus.stop()


@pytest.fixture(scope="module")
def kvroute_sim(kvroute_bin, tmp_path_factory):
    # Every block sampled for the pooled bound: a load of 24 requests holds too few blocks
    # for R = 0.01 to sample any, and the "Where the hits go" panels would show nothing.
    server = KvrouteSim(kvroute_bin, tmp_path_factory.mktemp("kvroute"), num_replicas=2,
                        extra_args=("--pooled-sample-rate", "1"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def loaded_prometheus(prometheus_bin, kvroute_sim, tmp_path_factory):
    """Prometheus scraping kvroute after a shared-prefix load: first one request per prefix
    (each prefix computed once), then the rest (hits), each phase scraped before the next."""
    prometheus = Prometheus(prometheus_bin, tmp_path_factory.mktemp("prometheus"),
                            [kvroute_sim.target])
    try:
        prometheus.wait_ready()
        prometheus.wait_for_scrape()
        prompts = shared_prefix_prompts(NUM_PREFIXES, REQUESTS_PER_PREFIX)
        for first, last in ((0, NUM_PREFIXES), (NUM_PREFIXES, NUM_REQUESTS)):
            assert send_completions(kvroute_sim.url, prompts[first:last]) == last - first
            prometheus.wait_for_requests(last)
        yield prometheus
    finally:
        prometheus.stop()


def test_substitution_fills_every_variable():
    for query in QUERIES:
        expr = substitute(query.expr, ALL_SELECTED)
        assert "$" not in expr, query.panel_title


def test_substitution_names_a_missing_variable():
    with pytest.raises(KeyError, match=r"\$replica"):
        substitute('up{replica=~"$replica"}', {"model": ".*"})


def test_prometheus_rejects_a_bad_query(empty_prometheus):
    with pytest.raises(PrometheusError, match="bad_data"):
        empty_prometheus.query("sum by (replica) (rate(kvroute_router_requests_total[1m])")


@pytest.mark.parametrize("query", QUERIES, ids=QUERY_IDS)
def test_every_panel_query_parses(empty_prometheus, query):
    assert empty_prometheus.query(substitute(query.expr, ALL_SELECTED)) == []


def test_rules_load_into_prometheus(empty_prometheus):
    health = empty_prometheus.rule_health()
    assert len(health) == 19
    assert set(health.values()) <= {"ok", "unknown"}


@pytest.mark.slow
@pytest.mark.parametrize("query", QUERIES, ids=QUERY_IDS)
def test_every_panel_query_returns_live_data(loaded_prometheus, query):
    samples = loaded_prometheus.query(substitute(query.expr, ALL_SELECTED))
    if not query.failures_only:
        assert samples, f"no series for {query.panel_title} [{query.ref_id}]"
    for labels, value in samples:
        assert math.isfinite(value), f"{query.panel_title} [{query.ref_id}] {labels}: {value}"


@pytest.mark.slow
def test_variables_list_the_model_and_both_replicas(loaded_prometheus):
    values = {}
    for variable in load_dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            match, label = LABEL_VALUES.match(variable["query"]["query"]).groups()
            values[variable["name"]] = loaded_prometheus.label_values(
                label, substitute(match, ALL_SELECTED))
    assert values["model"] == ["tiny"]
    assert len(values["replica"]) == 2


@pytest.mark.slow
def test_recording_rules_evaluate_on_live_series(loaded_prometheus):
    health = loaded_prometheus.rule_health()
    assert set(health.values()) == {"ok"}
    records = [name for name in health if ":" in name]
    assert len(records) == 10
    for record in records:
        samples = wait_until(lambda r=record: loaded_prometheus.query(r) or None, 10,
                             f"{record} evaluated")
        assert all(math.isfinite(value) for _, value in samples), record


@pytest.mark.slow
def test_miss_causes_add_up_to_the_uncached_prompt_tokens_live(loaded_prometheus):
    """Each direct route's end came back with the tokens its engine served from cache, so
    the routers' miss causes add up to the prompt tokens the engines looked up and did not
    find, exactly; the first request of each prefix found nothing (cold)."""
    seen: list[tuple[float, float]] = []

    def causes_and_uncached() -> bool | None:
        causes = loaded_prometheus.query("sum(kvroute_miss_tokens_total)")
        uncached = loaded_prometheus.query(
            "sum(kvroute_engine_prefix_cache_query_tokens_total)"
            " - sum(kvroute_engine_prefix_cache_hit_tokens_total)")
        if not causes or not uncached:
            return None
        seen.append((causes[0][1], uncached[0][1]))
        return True if seen[-1][0] == seen[-1][1] else None

    try:
        wait_until(causes_and_uncached, 30, "miss causes equal to the uncached tokens")
    except TimeoutError as error:
        raise AssertionError(f"(causes, uncached) seen: {seen[-3:]}") from error
    cold = loaded_prometheus.query('sum(kvroute_miss_tokens_total{cause="cold"})')
    assert cold and cold[0][1] > 0
