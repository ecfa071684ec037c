"""Two source trees' index builds side by side in one process: bench_router's fleet.

A companion to ab_router_trees.py, which builds each tree's router once (the old one
first): one build of a large fleet moves with the box's load by more than a cut of a few
percent. Here the trees build in turns, several rounds, the order flipped every round
(old, new; new, old; ...), each from freshly prepared events (a build hashes the events'
bytes objects, and a second build of the same objects would find their hashes cached):

    python benchmarks/ab_build_trees.py /tmp/old . [--replicas 256] [--blocks 1000000]
                                                   [--rounds 4]

Prints each build's feed() CPU and, per tree, the median and the sum, and whether the two
trees' indexes hold the same blocks (distinct hashes per medium, holdings, bytes).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time

from ab_router_trees import load_tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--replicas", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    trees = {"old": load_tree(args.old), "new": load_tree(args.new)}
    br = trees["new"][0]
    rng = random.Random(0)
    ids = [f"replica-{i:02d}" for i in range(args.replicas)]
    held = br.assign(rng, br.make_chains(rng, args.blocks), ids)
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    contents: dict[str, set] = {"old": set(), "new": set()}
    load0 = os.getloadavg()[0]
    for k in range(args.rounds):
        for v in ("old", "new") if k % 2 == 0 else ("new", "old"):
            brv, router_cls, config_cls = trees[v]
            router = router_cls(config_cls(policy="cache_aware", block_size=brv.BLOCK_SIZE))
            prepared = brv.prepare(held, random.Random(1))
            gc.collect()
            start = time.process_time()
            brv.feed(router, prepared)
            cpu[v].append(time.process_time() - start)
            index = router.index
            contents[v].add((index.num_blocks("device"), index.num_blocks("host"),
                             index.num_distinct_blocks(), index.nbytes()))
            print(f"round {k} {v}: feed cpu {cpu[v][-1]:.2f} s (load {os.getloadavg()[0]:.1f})",
                  flush=True)
            del router, prepared
    print(f"{args.replicas} replicas x {args.blocks:,} blocks, {args.rounds} builds each, "
          f"alternating; load {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    for v in ("old", "new"):
        print(f"{v}: feed cpu median {statistics.median(cpu[v]):.2f} s, sum {sum(cpu[v]):.2f} s; "
              f"index (device, host, distinct, bytes) {sorted(contents[v])}")
    print("same contents" if contents["old"] == contents["new"] else "CONTENTS DIFFER")


if __name__ == "__main__":
    main()
