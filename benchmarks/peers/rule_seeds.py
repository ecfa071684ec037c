"""Routing rules and settings against kvroute's default over seeds, at rungs of sim_routing's
ladders.

    python benchmarks/peers/rule_seeds.py --workload conversation --rates 0.125,0.25 \
        --seeds 0,1,2,3,4,5,6,7 --variant on:continuation_affinity=True \
        --rule continuation_affinity:load_over_mean=1.2,session_share=1.2

At a ladder's lowest rungs a load share is a handful of decisions, and one seed (the
ladder's) cannot tell a rule's effect from chance. This runs the event-fed cache_aware router
at sim_routing's defaults for the workload (8 replicas, their blocks, event timings; --rates
in req/s a replica, mooncake: time scales, `default`: the workload's ladder) once as
configured by default, once per --variant (LABEL:NAME=VALUE,... of RouterConfig fields) and
once per --rule (benchmarks/peers/emulation.py), each on each seed's own workload; with
--approximate each variant's approximate mode too (the ladders' hit - approximate). No round
robin baseline (rule_ladder.py runs sim_routing's whole ladder). Prints hit/bound, load
share, TTFT p90 and the decisions where continuation affinity overruled the cost ("kept":
with none, the decisions are the default's) per rung, seed and contender, then each one's
mean over the seeds.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.peers.emulation import install  # noqa: E402
from benchmarks.peers.emulation import rule as parse_rule  # noqa: E402
from benchmarks.simlib import experiment as ex  # noqa: E402
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim  # noqa: E402
from benchmarks.simlib.replica import ReplicaConfig  # noqa: E402
from benchmarks.simlib.report import summarize  # noqa: E402
from router.core.config import RouterConfig  # noqa: E402


def run(spec: ex.WorkloadSpec, router: RouterConfig, rule: str | None
        ) -> tuple[float, float, float, int]:
    """(hit/bound, load share, TTFT p90 s, continuations kept against the cost) of one run."""
    num_blocks = ex.DEFAULTS[spec.name].num_blocks
    workload = spec.build()
    config = ClusterConfig(spec.num_replicas, ReplicaConfig(num_blocks=num_blocks), router,
                           seed=spec.seed)
    sim = ClusterSim(config, workload)
    if rule is not None:
        install(sim, rule)
    s = summarize(sim.run(), "", ex.offered_qps(workload), 0.0, 0.0)
    kept = sum(r.policy.continuations.num_kept for r in sim.routers
               if getattr(r.policy, "continuations", None) is not None)
    return s.hit_rate_over_bound, s.load_share, s.ttft_p90_s, kept


def contenders(args: argparse.Namespace) -> list[tuple[str, dict, str | None]]:
    """(label, RouterConfig fields, rule) for each run a rung and seed."""
    out: list[tuple[str, dict, str | None]] = [("default", {}, None)]
    for text in args.variant:
        label, _, settings = text.partition(":")
        fields = {}
        for item in filter(None, settings.split(",")):
            name, _, value = item.partition("=")
            fields[name] = ast.literal_eval(value)
        out.append((label, fields, None))
    if args.approximate:
        out += [(f"{label}/approx", {**fields, "approximate": True}, None)
                for label, fields, _ in list(out)]
    out += [(spec, {}, spec) for spec in args.rule]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, choices=sorted(ex.DEFAULTS))
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--rates", required=True,
                   help="req/s a replica (mooncake: time scales), comma-separated, or default")
    p.add_argument("--seeds", default="0,1,2,3")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL:SETTINGS")
    p.add_argument("--rule", action="append", default=[], metavar="RULE[:GUARD]")
    p.add_argument("--approximate", action="store_true",
                   help="each variant's approximate mode too")
    args = p.parse_args(argv)
    for spec in args.rule:
        try:
            parse_rule(spec)
        except ValueError as err:
            p.error(str(err))
    d = ex.DEFAULTS[args.workload]
    rates = (d.ladder_per_replica if args.rates == "default"
             else [float(r) for r in args.rates.split(",")])
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = contenders(args)
    for rate in rates:
        rows: dict[str, list[tuple[float, float, float, int]]] = {label: []
                                                                  for label, *_ in runs}
        for seed in seeds:
            spec = ex.WorkloadSpec(args.workload, rate, args.replicas, seed)
            for label, fields, rule in runs:
                router = RouterConfig(approx_capacity_blocks=d.num_blocks, seed=seed)
                got = run(spec, replace(router, **fields), rule)
                rows[label].append(got)
                print(f"{args.workload} {rate:g}/replica s{seed} {label}: hit/bound "
                      f"{got[0]:.4f} share {got[1]:.3f} ttft p90 {got[2]:.4f} kept {got[3]}",
                      flush=True)
        for label, got in rows.items():
            hits, shares, p90s, _ = zip(*got)
            print(f"{args.workload} {rate:g}/replica MEAN {label}: hit/bound "
                  f"{sum(hits) / len(hits):.4f} (min {min(hits):.4f})  share "
                  f"{sum(shares) / len(shares):.3f} (max {max(shares):.3f})  ttft p90 "
                  f"{sum(p90s) / len(p90s):.4f}  shares {' / '.join(f'{s:.3f}' for s in shares)}",
                  flush=True)


if __name__ == "__main__":
    main()
