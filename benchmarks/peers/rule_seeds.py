"""Routing rules against kvroute's default over seeds, at a few rungs of sim_routing's ladders.

    python benchmarks/peers/rule_seeds.py --workload conversation --replicas 8 \
        --rates 0.125,0.25 --seeds 0,1,2,3,4,5,6,7 \
        --rule continuation_affinity:load_over_mean=1.2,session_share=1.2

At a ladder's lowest rungs a load share is a handful of decisions, and one seed (the
ladder's) cannot tell a rule's effect from chance. This runs the event-fed cache_aware router
alone (no round robin or approximate baselines: rule_ladder.py runs those) at sim_routing's
defaults for the workload (replicas' blocks, event timings), once with the default policy and
once per rule (benchmarks/peers/emulation.py), on each seed's own workload. Prints hit/bound
and load share per rung, seed and rule, then each rule's mean and max over the seeds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.peers.emulation import install  # noqa: E402
from benchmarks.peers.emulation import rule as parse_rule  # noqa: E402
from benchmarks.simlib import experiment as ex  # noqa: E402
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim  # noqa: E402
from benchmarks.simlib.replica import ReplicaConfig  # noqa: E402
from benchmarks.simlib.report import summarize  # noqa: E402
from router.core.config import RouterConfig  # noqa: E402

DEFAULT = "default"


def run(workload_name: str, replicas: int, rate_per_replica: float, seed: int,
        spec: str) -> tuple[float, float]:
    """(hit/bound, load share) of one run: the default policy, or the rule `spec`."""
    d = ex.DEFAULTS[workload_name]
    workload = ex.WorkloadSpec(workload_name, rate_per_replica, replicas, seed).build()
    router = RouterConfig(approx_capacity_blocks=d.num_blocks, seed=seed)
    config = ClusterConfig(replicas, ReplicaConfig(num_blocks=d.num_blocks), router, seed=seed)
    sim = ClusterSim(config, workload)
    if spec != DEFAULT:
        install(sim, spec)
    s = summarize(sim.run(), spec, ex.offered_qps(workload), 0.0, 0.0)
    return s.hit_rate_over_bound, s.load_share


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, choices=sorted(ex.DEFAULTS))
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--rates", required=True, help="req/s a replica, comma-separated")
    p.add_argument("--seeds", default="0,1,2,3")
    p.add_argument("--rule", action="append", required=True, metavar="RULE[:GUARD]")
    args = p.parse_args(argv)
    for spec in args.rule:
        try:
            parse_rule(spec)
        except ValueError as err:
            p.error(str(err))
    seeds = [int(s) for s in args.seeds.split(",")]
    specs = [DEFAULT, *args.rule]
    for rate in (float(r) for r in args.rates.split(",")):
        rows: dict[str, list[tuple[float, float]]] = {spec: [] for spec in specs}
        for seed in seeds:
            for spec in specs:
                hit, share = run(args.workload, args.replicas, rate, seed, spec)
                rows[spec].append((hit, share))
                print(f"{args.workload} {rate:g}/replica s{seed} {spec}: hit/bound {hit:.4f} "
                      f"share {share:.3f}", flush=True)
        for spec, got in rows.items():
            hits, shares = zip(*got)
            print(f"{args.workload} {rate:g}/replica mean {spec}: hit/bound "
                  f"{sum(hits) / len(hits):.4f} (min {min(hits):.4f})  share "
                  f"{sum(shares) / len(shares):.3f} (max {max(shares):.3f})  per seed "
                  f"{' / '.join(f'{s:.3f}' for s in shares)}", flush=True)


if __name__ == "__main__":
    main()
