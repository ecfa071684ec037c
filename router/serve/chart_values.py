"""The serve settings as the Helm chart (helm/kvroute) sets them: which chart value carries
each setting, and the values schema of those keys, generated from `ServeSettings`.

    python -m router.serve.chart_values          # rewrite helm/kvroute/values.schema.json
    python -m router.serve.chart_values --check  # exit 1 when it is out of date

The rest of values.schema.json (images, pods, monitoring) is the chart's own and is kept as
written. The chart's templates/_serve.tpl passes each value below as the setting's arg;
tests/deploy/test_chart_values.py renders the chart to check both directions.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.serve.settings import ServeSettings

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "helm" / "kvroute" / "values.schema.json"


@dataclass(frozen=True)
class ChartValue:
    """One chart value: its dotted path in values.yaml and what the chart checks beyond the
    setting's own bounds."""

    path: str
    extra_schema: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not self.path or any(not part for part in self.path.split(".")):
            raise ValueError(f"ChartValue: bad dotted path {self.path!r}")


# Setting name -> chart value. The chart also sets `model` (from model.source, or
# model.servedName with workers), `tokenizer` (with workers: model.source's checkpoint),
# `gpus_per_rank` (1 when engine.engine is real) and `api_keys_file` (from apiKeys): values,
# not copies.
CHART_VALUES: dict[str, ChartValue] = {
    "replicas": ChartValue("engine.replicas"),
    # A worker pod holds every rank of its replica, so tp GPUs must fit one node.
    "tp": ChartValue("engine.tp", {"maximum": 8}),
    "engine": ChartValue("engine.engine"),
    "block_size": ChartValue("engine.blockSize", {"maximum": 1024}),
    "num_blocks": ChartValue("engine.numBlocks"),
    # 0 host blocks is spelled engine.hostTier.enabled: false.
    "num_host_blocks": ChartValue("engine.hostTier.numBlocks", {"minimum": 1}),
    "cpus_per_rank": ChartValue("engine.cpusPerRank"),
    "policy": ChartValue("routing.policy"),
    "approximate": ChartValue("routing.approximate"),
    "load_weight": ChartValue("routing.loadWeight"),
    "host_cost_fraction": ChartValue("routing.hostCostFraction"),
    "pooled_sample_rate": ChartValue("pooledBound.sampleRate"),
    "pooled_window_s": ChartValue("pooledBound.windowSeconds"),
    "gateways": ChartValue("gateway.replicas"),
    "ingress": ChartValue("gateway.ingress"),
    "workers": ChartValue("workers", {"items": {"type": "string", "pattern": "^https?://"}}),
}


def setting_schema(name: str) -> dict[str, Any]:
    """The JSON schema of one chart value, from the setting's type, bounds and description."""
    prop = dict(ServeSettings.model_json_schema()["properties"][name])
    # The chart always passes a value, so "unset" (null) is not a chart value.
    branches = [b for b in prop.pop("anyOf", []) if b.get("type") != "null"]
    if len(branches) > 1:
        raise ValueError(f"setting {name}: a chart value needs one type, got {branches}")
    out = {**(branches[0] if branches else {}),
           **{k: v for k, v in prop.items() if k not in ("title", "default")},
           **CHART_VALUES[name].extra_schema}
    # type first and description last, as the hand-written rest of the file reads
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "type", kv[0] == "description")))


def _node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The object schema holding the last key of `path`."""
    node = schema
    for part in path.split(".")[:-1]:
        node = node["properties"][part]
    return node["properties"]


def generated(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (values.schema.json, parsed) with every chart value's schema regenerated."""
    out = json.loads(json.dumps(schema))  # a deep copy, in the same key order
    for name, value in CHART_VALUES.items():
        parent = _node(out, value.path)
        key = value.path.rsplit(".", 1)[-1]
        if key not in parent:
            raise KeyError(f"values.schema.json has no {value.path} (setting {name})")
        parent[key] = setting_schema(name)
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schema", type=Path, default=SCHEMA_PATH)
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    args = parser.parse_args(argv)
    current = args.schema.read_text()
    wanted = render(generated(json.loads(current)))
    if current == wanted:
        return 0
    if args.check:
        print(f"{args.schema} is out of date: run python -m router.serve.chart_values",
              file=sys.stderr)
        return 1
    args.schema.write_text(wanted)
    print(f"wrote {args.schema}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
