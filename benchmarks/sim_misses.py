"""Where shared_prefix's (or generated_shared_prefix's) misses come from, per router mode.

    python benchmarks/sim_misses.py --rate 1.0 [--approximate] [--num-blocks N] [--seed S]

Runs the workload (8 replicas, the default RouterConfig, the workload's capacity unless
--num-blocks) and prints each request's prefix and question outcome counted at routing time
from the engines' contents (benchmarks/simlib/grouped_misses.py), the hit rate, the pooled
bound, and the blocks each replica evicted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simlib import experiment as ex  # noqa: E402
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim  # noqa: E402
from benchmarks.simlib.grouped_misses import run_classified  # noqa: E402
from benchmarks.simlib.replica import ReplicaConfig  # noqa: E402
from router.core.config import RouterConfig  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="shared_prefix",
                   choices=("shared_prefix", "generated_shared_prefix"))
    p.add_argument("--rate", type=float, default=1.0, help="req/s per replica")
    p.add_argument("--approximate", action="store_true", help="routed history, no events")
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a smoke-test size only")
    args = p.parse_args(argv)
    num_blocks = args.num_blocks or ex.DEFAULTS[args.workload].num_blocks
    replica = ReplicaConfig(num_blocks=num_blocks)
    router = RouterConfig(approximate=args.approximate, approx_capacity_blocks=num_blocks)
    workload = ex.build_workload(args.workload, args.rate, args.replicas, args.seed,
                                 quick=args.quick)
    sys_segment, q_segment = workload.items[0].segments
    block_size = replica.block_size
    sim = ClusterSim(ClusterConfig(args.replicas, replica, router), workload)
    result, counts = run_classified(sim, sys_segment.num_tokens // block_size,
                                    q_segment.num_tokens // block_size)
    records = result.records
    hit = (sum(r.cached_device_tokens + r.cached_host_tokens for r in records)
           / sum(r.num_prompt_tokens for r in records))
    evictions = [rep.core.kv.pool.num_evictions for rep in result.replicas]
    mode = "approximate" if args.approximate else "cache_aware"
    print(f"{args.workload} at {args.rate} req/s a replica, {mode}, {num_blocks} blocks a "
          f"replica, seed {args.seed}: hit {hit:.4f}, bound {result.pooled.hit_rate:.4f}")
    for key in sorted(counts):
        print(f"  {key:<26}{counts[key]:>6}")
    print(f"  evicted blocks per replica {evictions} (total {sum(evictions)})")
    return dict(counts=dict(counts), hit_rate=hit, bound=result.pooled.hit_rate,
                evictions=evictions)


if __name__ == "__main__":
    main()
