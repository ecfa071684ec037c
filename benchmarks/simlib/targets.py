"""The ladder figures: the policy under test against approximate mode and the pooled
bound on every rung (benchmarks/NOTEBOOK.md, "Routing at scale, simulated", has the targets).

- worst_hit_minus_approximate: min over rungs of hit rate - approximate's hit rate;
- worst_ttft_p90_over_approximate: max over rungs of TTFT p90 / approximate's;
- worst_hit_over_bound_below_saturation: min of hit/bound over the rungs below round
  robin's saturation rate (every rung when it never saturates);
- max_load_share: max over rungs of the load share;
- min_request_share: min over rungs of the least routed replica's requests over the mean.
"""

from __future__ import annotations

import math

from benchmarks.simlib.report import Summary


def ladder_figures(runs: list[Summary], approximate: list[Summary] | None,
                   saturation_qps: float | None) -> dict[str, float]:
    """The figures above for `runs` (one Summary a rung, rising rate)."""
    below = [s for s in runs if saturation_qps is None or s.rate_qps < saturation_qps]
    out = {
        "worst_hit_over_bound_below_saturation": min(
            (s.hit_rate_over_bound for s in below), default=math.nan),
        "max_load_share": max(s.load_share for s in runs),
        "min_request_share": min(s.min_request_share for s in runs),
    }
    if approximate is not None:
        pairs = list(zip(runs, approximate, strict=True))
        out["worst_hit_minus_approximate"] = min(s.hit_rate - a.hit_rate for s, a in pairs)
        out["worst_ttft_p90_over_approximate"] = max(
            s.ttft_p90_s / a.ttft_p90_s if a.ttft_p90_s > 0 else math.nan for s, a in pairs)
    return out
