"""A rate ladder with several gateways: the policy behind G = 1 and each larger G, side by
side on the same workload and arrivals (sim_routing.py --gateways).

Contenders, by label:
- `<policy>`: one gateway (the reference);
- `round_robin`: one gateway, the baseline that fixes the saturation rate;
- `<policy>@<G>gw[/<spread>]`: G gateways, each with its own marks, load and history;
- `<policy>@<G>gw[/<spread>]+marks`: the largest G again, its routers sharing pending marks
  (with --share-pending-delay-s);
- `<policy>@<G>gw[/<spread>]+marks+work`: sharing their routed work too (with --share-work).
`/<spread>` names a spread other than round robin (benchmarks/simlib/gateways.py); `/rot`
says each router lists the replicas from its own offset, its rank's as live routers do
(--rotate-candidates), `/rot-id` from an offset hashed from its id, as a live router does
before it knows its rank (--offset-by-id).

Figures, over the rungs below round robin's saturation rate (every rung when it never
saturates):
- worst_hit_loss_vs_one_gateway: max over rungs and over G > 1 without sharing of the hit
  rate at one gateway minus the hit rate at G (negative: G gateways hit more);
- max_load_share: max over rungs of the load share, at G = 1 and every G > 1 without sharing;
- the same two for the contenders that share marks (`..._marks`) and marks and routed work
  (`..._marks_work`);
- per contender: its worst hit loss, its max load share, and the block hashes its routers
  shared (sent; marked by the receivers, all of them together) per decision.
"""

from __future__ import annotations

from dataclasses import replace

from benchmarks.simlib.experiment import Contender
from benchmarks.simlib.report import Summary
from router.core.config import RouterConfig


def gateway_label(policy: str, num_routers: int, spread: str, marks: bool = False,
                  work: bool = False, rotate: bool = False, by_id: bool = False) -> str:
    if num_routers == 1:
        return policy
    return (f"{policy}@{num_routers}gw" + ("" if spread == "round_robin" else f"/{spread}")
            + ("/rot" if rotate else "") + ("-id" if rotate and by_id else "")
            + ("+marks" if marks else "")
            + ("+work" if work else ""))


def gateway_contenders(policy: str, base: RouterConfig, gateways: list[int],
                       spreads: list[str], share_pending_delay_s: float | None,
                       share_work: bool = False, rotate: bool = False,
                       shared_only: bool = False, by_id: bool = False) -> list[Contender]:
    """One gateway, the round robin baseline, then every G > 1 under every spread, then the
    largest G sharing pending marks (when a delay is given), then sharing routed work too.
    `shared_only`: of the G > 1 contenders only the one sharing the most (a shorter run)."""
    router = replace(base, policy=policy, approximate=False)
    out = [Contender(policy, router)]
    if policy != "round_robin":
        out.append(Contender("round_robin", replace(router, policy="round_robin")))
    larger = sorted(g for g in set(gateways) if g > 1)
    for g in larger if not shared_only else []:
        for spread in spreads:
            out.append(Contender(gateway_label(policy, g, spread, rotate=rotate, by_id=by_id),
                                 router, g, spread, rotate_candidates=rotate,
                                 offset_by_id=by_id))
    if share_pending_delay_s is not None and larger:
        for work in (False, True)[shared_only and share_work:1 + share_work]:
            for spread in spreads:
                out.append(Contender(
                    gateway_label(policy, larger[-1], spread, True, work, rotate, by_id),
                    router, larger[-1], spread, share_pending_delay_s, work, rotate, by_id))
    return out


def gateway_figures(by_label: dict[str, list[Summary]], contenders: list[Contender],
                    policy: str, saturation_qps: float | None) -> dict:
    """The figures above; `by_label` holds one Summary a rung (rising rate) per contender."""
    one = by_label[policy]
    below = [i for i, s in enumerate(one) if saturation_qps is None or s.rate_qps < saturation_qps]
    per: dict[str, dict[str, float]] = {}
    for c in contenders:
        if c.router.policy != policy:
            continue
        runs = by_label[c.label]
        per[c.label] = {
            "worst_hit_loss": max(one[i].hit_rate - runs[i].hit_rate for i in below),
            "max_load_share": max(runs[i].load_share for i in below),
            "shared_blocks_per_decision": max(runs[i].shared_blocks_per_decision
                                              for i in below),
            "marked_blocks_per_decision": max(runs[i].marked_blocks_per_decision
                                              for i in below)}
    groups = {"": [c.label for c in contenders if c.router.policy == policy
                   and c.share_pending_delay_s is None],
              "_marks": [c.label for c in contenders
                         if c.share_pending_delay_s is not None and not c.share_work],
              "_marks_work": [c.label for c in contenders if c.share_work]}
    out: dict = {"gateway_rungs_below_saturation": len(below)}
    for suffix, labels in groups.items():
        several = [k for k in labels if k != policy]
        if several:
            out[f"worst_hit_loss_vs_one_gateway{suffix}"] = max(per[k]["worst_hit_loss"]
                                                                for k in several)
            out[f"max_load_share{suffix}"] = max(per[k]["max_load_share"] for k in labels)
    out["per_contender"] = {k: {f: round(v, 4) for f, v in d.items()} for k, d in per.items()}
    return out


def gateway_table(by_label: dict[str, list[Summary]], labels: list[str]) -> str:
    """Per rung, each contender's hit rate and load share."""
    width = max(len(k) for k in labels)
    rates = [s.rate_qps for s in by_label[labels[0]]]
    head = f"{'contender':<{width}} " + " ".join(f"{f'{r:.2f} req/s':>14}" for r in rates)
    rows = [head, f"{'':<{width}} " + " ".join(f"{'hit  share':>14}" for _ in rates)]
    for k in labels:
        rows.append(f"{k:<{width}} " + " ".join(f"{s.hit_rate:>8.3f} {s.load_share:>5.2f}"
                                                for s in by_label[k]))
    return "\n".join(rows)
