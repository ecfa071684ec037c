"""The PromQL behind every panel of dashboards/kvroute.json, ready for Prometheus's HTTP API.

Grafana fills in variables before it sends a query; `substitute` does the same, so a query
taken from here is exactly what Grafana would run with those variable values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

DASHBOARD_PATH = Path(__file__).with_name("kvroute.json")

# A panel whose description starts with this shows only failures: no series is its normal,
# healthy state (e.g. approximate-mode fallbacks).
FAILURES_ONLY_PREFIX = "Failures only:"

# Variable values that select everything: what Grafana sends for "All" with allValue ".*".
ALL_SELECTED = {"model": ".*", "replica": ".*", "__rate_interval": "1m"}

# $name, ${name} and [[name]], the three spellings Grafana accepts.
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)|\[\[(\w+)\]\]")


class PanelQuery(NamedTuple):
    """One target (query) of one panel."""

    panel_title: str
    ref_id: str
    expr: str  # as written in the dashboard, variables unexpanded
    legend_format: str
    failures_only: bool


def load_dashboard(path: Path = DASHBOARD_PATH) -> dict:
    with open(path) as f:
        return json.load(f)


def iter_panels(dashboard: Mapping) -> Iterator[dict]:
    """Every non-row panel, including those nested in collapsed rows, in dashboard order."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def panel_queries(dashboard: Mapping) -> list[PanelQuery]:
    return [
        PanelQuery(
            panel_title=panel["title"],
            ref_id=target["refId"],
            expr=target["expr"],
            legend_format=target.get("legendFormat", ""),
            failures_only=panel.get("description", "").startswith(FAILURES_ONLY_PREFIX),
        )
        for panel in iter_panels(dashboard)
        for target in panel.get("targets", [])
    ]


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Expands Grafana variables in `expr`; raises KeyError naming any variable not given."""

    def value_of(match: re.Match) -> str:
        name = next(group for group in match.groups() if group is not None)
        if name not in values:
            raise KeyError(f"query uses variable ${name}, which has no value: {expr}")
        return values[name]

    return _VARIABLE.sub(value_of, expr)
