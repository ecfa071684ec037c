"""A full cyclic collection's pause in a process shaped like a router replica, with and
without freezing the start-up heap (router/core/process_policy.py).

Imports what a Serve router replica and an external gateway import (Ray, Serve, kvroute's
router and gateway), builds bench_router's index, then times `gc.collect(2)` (process CPU,
median of 5) before and after `freeze_startup_heap()`. A full collection walks every
tracked object, and runs inside whichever routing decision allocates when it triggers.

    python benchmarks/gc_pause.py [--replicas 64] [--blocks 1000000]

Prints one line, then one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_router as br  # noqa: E402
import ray  # noqa: E402, F401
import ray.serve  # noqa: E402, F401

import router.gateway.external_gateway  # noqa: E402, F401
import router.serve.request_router  # noqa: E402, F401
from router.core.process_policy import freeze_startup_heap  # noqa: E402
from router.core.router import Router, RouterConfig  # noqa: E402


def full_collection_ms(runs: int = 5) -> float:
    """Median process CPU of a full collection, in ms."""
    spent = []
    for _ in range(runs):
        start = time.process_time()
        gc.collect(2)
        spent.append((time.process_time() - start) * 1000)
    return sorted(spent)[runs // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    args = ap.parse_args()
    rng = random.Random(0)
    replica_ids = [f"replica-{i:02d}" for i in range(args.replicas)]
    chains = br.make_chains(rng, args.blocks)
    held = br.assign(rng, chains, replica_ids)
    router = Router(RouterConfig(block_size=br.BLOCK_SIZE), clock=lambda: 0.0)
    br.feed(router, br.prepare(held, random.Random(1)))
    del chains, held
    gc.collect()
    tracked = len(gc.get_objects())
    before_ms = full_collection_ms()
    frozen = freeze_startup_heap()
    after_ms = full_collection_ms()
    load = os.getloadavg()[0]
    print(f"{args.replicas} replicas x {args.blocks:,} blocks indexed; {tracked:,} tracked "
          f"objects; full collection {before_ms:.1f} ms of CPU, {after_ms:.1f} ms after "
          f"freezing {frozen:,}; load average {load:.1f} on {os.cpu_count()} CPUs")
    print(json.dumps({"replicas": args.replicas, "blocks": args.blocks,
                      "tracked_objects": tracked, "full_gc_ms": round(before_ms, 1),
                      "full_gc_frozen_ms": round(after_ms, 2), "frozen_objects": frozen,
                      "load_average_1m": round(load, 2)}))


if __name__ == "__main__":
    main()
