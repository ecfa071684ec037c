"""What a router that knew shared_prefix's groups could reach: each group's requests all go
to one replica, by a fixed quota of groups per replica.

    python benchmarks/sim_partition.py --rate 1.0 --quota 19,19,19,19,19,19,18,18 \
        --quota 18,18,18,18,18,18,18,24

An oracle, not a policy: the n-th group seen goes to the next replica (in turn) whose quota
is not full, and all its later requests follow it. It needs nothing the router does not
see (a group is its prompt's first block) except the quota, which is chosen offline. Each
quota runs the same workload, capacity and simulator as `sim_routing.py`; the table gives
the hit rate, hit/bound (the pooled LRU bound), TTFT p90 and load share, next to the
default router's cache_aware and approximate modes. It measures whether the targets
(hit/bound >= 0.97 with load share <= 1.10) are reachable at all by keeping groups whole.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simlib import experiment as ex  # noqa: E402
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim  # noqa: E402
from benchmarks.simlib.replica import ReplicaConfig  # noqa: E402
from benchmarks.simlib.report import summarize  # noqa: E402
from router.core.config import RouterConfig  # noqa: E402
from router.core.policies import ReplicaView, RouteQuery  # noqa: E402


class GroupQuota:
    """Places whole groups (keyed on the prompt's first block) by a quota per replica."""

    name: ClassVar[str] = "group_quota"
    uses_index: ClassVar[bool] = False

    def __init__(self, quota: Sequence[int]):
        self.quota = list(quota)
        self._group_replica: dict[bytes, int] = {}
        self._count = [0] * len(quota)
        self._next = 0

    def _place(self, key: bytes) -> int:
        n = len(self.quota)
        for step in range(n):
            i = (self._next + step) % n
            if self._count[i] < self.quota[i]:
                break
        else:
            raise RuntimeError(f"more groups than the quota's {sum(self.quota)}")
        self._count[i] += 1
        self._next = (i + 1) % n
        self._group_replica[key] = i
        return i

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        key = query.block_hashes[0]
        i = self._group_replica.get(key)
        if i is None:
            i = self._place(key)
        ids = list(query.replica_ids)
        return [ids[i]] + ids[:i] + ids[i + 1:]

    def choose(self, query: RouteQuery, view: ReplicaView) -> str:
        return self.rank(query, view)[0]


def run(label: str, workload, replica: ReplicaConfig, router: RouterConfig, rate_qps: float,
        quota: Sequence[int] | None) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    sim = ClusterSim(ClusterConfig(len(quota) if quota else 8, replica, router), workload)
    if quota:
        sim.router.policy = GroupQuota(quota)
    result = sim.run()
    s = summarize(result, label, rate_qps, time.perf_counter() - t0, time.process_time() - c0)
    return dict(label=label, hit=s.hit_rate, bound=s.pooled_bound_hit_rate,
                hit_over_bound=s.hit_rate_over_bound, ttft_p90_s=s.ttft_p90_s,
                load_share=s.load_share)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="shared_prefix",
                   choices=("shared_prefix", "generated_shared_prefix"))
    p.add_argument("--rate", type=float, action="append", required=True,
                   help="req/s per replica (repeat for several rungs)")
    p.add_argument("--quota", action="append", required=True,
                   help="groups per replica, comma-separated (one entry per replica)")
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-routers", action="store_true",
                   help="skip the default router's two modes")
    args = p.parse_args(argv)
    quotas = [[int(x) for x in q.split(",")] for q in args.quota]
    if len({len(q) for q in quotas}) != 1:
        raise SystemExit("every --quota needs one entry per replica, the same count")
    num_replicas = len(quotas[0])
    num_blocks = args.num_blocks or ex.DEFAULTS[args.workload].num_blocks
    replica = ReplicaConfig(num_blocks=num_blocks)
    rows = []
    for rate in args.rate:
        workload = ex.build_workload(args.workload, rate, num_replicas, args.seed)
        qps = rate * num_replicas
        contenders: list[tuple[str, RouterConfig, list[int] | None]] = []
        if not args.no_routers:
            contenders += [
                ("cache_aware", RouterConfig(), None),
                ("approximate", RouterConfig(approximate=True,
                                             approx_capacity_blocks=num_blocks), None)]
        contenders += [(f"quota {'/'.join(map(str, q))}", RouterConfig(), q) for q in quotas]
        for label, router, quota in contenders:
            row = run(label, workload, replica, router, qps, quota)
            row.update(rate_per_replica=rate, num_blocks=num_blocks, seed=args.seed)
            rows.append(row)
            print(f"{rate:>5} req/s/replica  {label:<36} hit {row['hit']:.4f}  hit/bound "
                  f"{row['hit_over_bound']:.3f}  ttft_p90 {row['ttft_p90_s']:.3f} s  share "
                  f"{row['load_share']:.3f}", flush=True)
    print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
