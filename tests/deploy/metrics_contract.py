"""The metric names and types of docs/metrics.md, the contract every query must keep to."""

import re
from pathlib import Path

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
_ROW = re.compile(r"^\|\s*(kvroute_\w+)\s*\|\s*(counter|gauge|histogram)\s*\|")


def contract_types() -> dict[str, str]:
    """Series name -> counter | gauge | histogram_series, with a histogram's _bucket, _sum and
    _count series spelled out."""
    types = {}
    for line in METRICS_DOC.read_text().splitlines():
        match = _ROW.match(line)
        if not match:
            continue
        name, kind = match.groups()
        if kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                types[name + suffix] = "histogram_series"
        else:
            types[name] = kind
    return types
