"""Two source trees' routers side by side in one process: bench_router's fleet and prompts.

Across processes this box moves the same tree's decision p99 by 30-60% from run to run
(results/bench_router_fleet.txt); two routers in one process, fed the same fleet and routing
the same prompts alternately (the old tree's first on even prompts, the new one's on odd),
meet the same load, cache and clock, and a null pair (one tree twice) differs by ~2%. Each
tree's modules are imported apart (its own `router` package), so any two commits compare:

    git clone -q /work/main /tmp/old && (cd /tmp/old && git checkout <sha>)
    python benchmarks/ab_router_trees.py /tmp/old . [--replicas 64] [--blocks 1000000]
                                                    [--decisions 8000]

Prints each tree's feed() CPU (one build each, the old tree's first), Router.route thread CPU
percentiles (after 500 warm-up decisions), how many decisions were identical (replica,
predicted hits, ranking), and a digest of each tree's decisions. Finished requests are
released as in bench_router (256 outstanding), both routers on a simulated clock.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import random
import sys
import time
from pathlib import Path

WARMUP = 500


def load_tree(tree: str):
    """(bench_router, Router, RouterConfig) imported from `tree`, apart from any other."""
    for name in [m for m in sys.modules
                 if m in ("router", "bench_router") or m.startswith("router.")]:
        del sys.modules[name]
    sys.path[:0] = [tree, str(Path(tree) / "benchmarks")]
    try:
        import bench_router

        import router.core.router as router_mod
    finally:
        del sys.path[:2]
    if not Path(router_mod.__file__).resolve().is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"{tree}: imported {router_mod.__file__} instead")
    return bench_router, router_mod.Router, router_mod.RouterConfig


def pct(values: list[int], q: float) -> float:
    return values[min(int(q * len(values)), len(values) - 1)] / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--decisions", type=int, default=8000)
    args = ap.parse_args()
    trees = {"old": load_tree(args.old), "new": load_tree(args.new)}
    br = trees["new"][0]
    rng = random.Random(0)
    ids = [f"replica-{i:02d}" for i in range(args.replicas)]
    chains = br.make_chains(rng, args.blocks)
    held = br.assign(rng, chains, ids)
    prompts = br.make_prompts(rng, chains, args.decisions + WARMUP)
    now = [0.0]
    routers, build_cpu = {}, {}
    for v, (brv, router_cls, config_cls) in trees.items():
        router = router_cls(config_cls(policy="cache_aware", block_size=brv.BLOCK_SIZE),
                            clock=lambda: now[0])
        prepared = brv.prepare(held, random.Random(1))
        gc.collect()
        cpu0 = time.process_time()
        brv.feed(router, prepared)
        build_cpu[v] = time.process_time() - cpu0
        del prepared
        routers[v] = router
    gc.collect()
    gc.freeze()  # both indexes' start-up heap, as the product freezes its own
    cpu = time.thread_time_ns
    times: dict[str, list[int]] = {"old": [], "new": []}
    digests = {v: hashlib.sha256() for v in routers}
    same, inflight = 0, []
    load0 = os.getloadavg()[0]
    tokens = br.PROMPT_BLOCKS * br.BLOCK_SIZE
    for i, (_, hashes) in enumerate(prompts):
        now[0] += 0.005
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        decided = {}
        for v in order:
            start = cpu()
            decided[v] = routers[v].route(f"q{i}", hashes, tokens, ids, 256)
            spent = cpu() - start
            if i >= WARMUP:
                times[v].append(spent)
            digests[v].update(repr(tuple(decided[v])).encode())
        same += decided["old"] == decided["new"]
        inflight.append(f"q{i}")
        if len(inflight) > 256:
            done = inflight.pop(0)
            for v in order:
                routers[v].on_finished(done)
    print(f"{args.replicas} replicas x {args.blocks:,} blocks, {args.decisions} decisions each, "
          f"alternating in one process; load {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"identical decisions {same}/{len(prompts)}")
    for v in ("old", "new"):
        t = sorted(times[v])
        print(f"{v}: build cpu {build_cpu[v]:.2f} s; route cpu p50 {pct(t, .5):.1f} "
              f"p90 {pct(t, .9):.1f} p99 {pct(t, .99):.1f} mean {sum(t) / len(t) / 1000:.1f} us; "
              f"decisions {digests[v].hexdigest()[:16]}")


if __name__ == "__main__":
    main()
