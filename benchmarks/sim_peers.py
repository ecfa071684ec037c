"""bench_peers.py's workloads in the simulator, for router what-ifs before a live run.

    python benchmarks/sim_peers.py --workload conversation --seeds 1,2,3 \
        --variant default: --variant lw0.3:load_weight=0.3 --variant approx:approximate=1

Each workload at bench_peers' shapes (benchmarks/peers/workloads.py: its flags' defaults),
on 4 replicas with the live workers' pools and step budgets, kvroute engine's event timings
(published every 10 ms, delivered 20 ms later), answers that do not re-encode (the live
client resends them as text) and one router. Prints hit/bound, load share and TTFT p90 per
variant and seed, then each variant's mean over the seeds; a variant is
LABEL:NAME=VALUE,... of RouterConfig fields. --rule adds a row decided by another rule at the
default settings (benchmarks/peers/emulation.py: the peers' cache_aware, or kvroute's with
continuation affinity, optionally with a guard that lets the cost move a turn after all):

    python benchmarks/sim_peers.py --workload multi_turn --seeds 1,2,3,4,5,6,7,8 \
        --variant default: --rule peer_cache_aware --rule continuation_affinity \
        --rule continuation_affinity:session_share=1.2
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_peers import MAX_BATCHED_TOKENS, MAX_SEQS  # noqa: E402
from benchmarks.peers.emulation import RULES, install  # noqa: E402
from benchmarks.peers.emulation import rule as parse_rule  # noqa: E402
from benchmarks.peers.workloads import WORKLOADS, add_workload_flags, peer_workload  # noqa
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim  # noqa: E402
from benchmarks.simlib.replica import ReplicaConfig  # noqa: E402
from benchmarks.simlib.report import summarize  # noqa: E402
from router.core.config import RouterConfig  # noqa: E402


def parse_variant(text: str) -> tuple[str, dict]:
    label, _, settings = text.partition(":")
    fields = {}
    for item in filter(None, settings.split(",")):
        name, _, value = item.partition("=")
        fields[name] = ast.literal_eval(value)
    return label, fields


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", action="append", choices=WORKLOADS, required=True)
    p.add_argument("--variant", action="append", default=[], metavar="LABEL:SETTINGS")
    p.add_argument("--rule", action="append", default=[], metavar="RULE[:GUARD]",
                   help=f"also route by this rule (repeat): one of {', '.join(RULES)}, "
                        "continuation_affinity with a guard as emulation.rule parses it")
    p.add_argument("--seeds", default="1")
    p.add_argument("--step-time-scale", type=float, default=1.1,
                   help="live steps on the shared box run this much slower (sim_vs_live fits)")
    add_workload_flags(p)
    args = p.parse_args(argv)
    for spec in args.rule:
        try:
            parse_rule(spec)
        except ValueError as err:
            p.error(str(err))
    variants = [(*parse_variant(v), None) for v in args.variant]
    variants += [(rule, {}, rule) for rule in args.rule]
    if not variants:
        p.error("give at least one --variant or --rule")
    for name in args.workload:
        spec = peer_workload(name, args)
        means: dict[str, list[tuple[float, float, float]]] = {v[0]: [] for v in variants}
        for seed in (int(s) for s in args.seeds.split(",")):
            workload = spec.build(seed)
            for label, fields, rule in variants:
                router = RouterConfig(approx_capacity_blocks=spec.num_blocks,
                                      **{"approximate": False, **fields})
                replica = ReplicaConfig(num_blocks=spec.num_blocks, max_num_seqs=MAX_SEQS,
                                        max_num_batched_tokens=MAX_BATCHED_TOKENS,
                                        step_time_scale=args.step_time_scale)
                config = ClusterConfig(4, replica, router, event_delay_s=0.02,
                                       publish_interval_s=0.01, model_name="tiny",
                                       answers_reencode=False, seed=seed)
                sim = ClusterSim(config, workload)
                if rule is not None:
                    install(sim, rule)
                s = summarize(sim.run(), label, 0.0, 0.0, 0.0)
                means[label].append((s.hit_rate_over_bound, s.load_share, s.ttft_p90_s))
                print(f"{name:<13}s{seed:<3}{label:<22} hit/bound {s.hit_rate_over_bound:.4f}  "
                      f"share {s.load_share:.3f}  ttft p90 {s.ttft_p90_s:.3f}", flush=True)
        for label, rows in means.items():
            hit, share, p90 = (sum(col) / len(col) for col in zip(*rows))
            print(f"{name:<13}mean {label:<22} hit/bound {hit:.4f}  share {share:.3f}  "
                  f"ttft p90 {p90:.3f}  (min hit/bound {min(r[0] for r in rows):.4f}, "
                  f"max share {max(r[1] for r in rows):.3f})", flush=True)


if __name__ == "__main__":
    main()
