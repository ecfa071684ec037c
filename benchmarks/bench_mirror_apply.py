"""Block events a second one router applies to its index, a batch at a time or a poll's
batches at once (`PrefixIndex.apply_batches`), in one process (no Ray).

Every router's mirror applies every block event of the fleet, so this rate caps what a
fleet can send (bench_index_actor.py measures the actor and the Ray calls around it). The
replicas replay the simulator's Mooncake batch shapes (benchmarks/simlib/event_shapes.py)
over xxh3 digests, from a snapshot of `--held-blocks` each; a warm-up of
`--warmup-rounds` publishes per replica brings the table to its steady size first. Each
group size applies the same batches to a fresh router, so the rates are side by side.

    nice -n 19 .venv/bin/python benchmarks/bench_mirror_apply.py --replicas 256

Prints per group size: blocks a second (CPU time of this process), microseconds a batch;
`uptime`; the JSON line last.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simlib.event_shapes import (  # noqa: E402
    ReplicaFeed,
    Shapes,
    capture_shapes,
    hash_ring,
)
from kv.events import EventBatch  # noqa: E402
from router.core.router import Router, RouterConfig  # noqa: E402


def feeds_of(shapes: Shapes, num_replicas: int, ring: list[bytes], held_blocks: int
             ) -> list[ReplicaFeed]:
    per = shapes.per_replica
    return [ReplicaFeed(f"b{k}", per[k % len(per)], ring, k * 7919 % len(ring), held_blocks,
                        start_batch=k // len(per) * 101) for k in range(num_replicas)]


def run_group(shapes: Shapes, args, ring: list[bytes], group: int) -> dict:
    """A fresh router fed snapshots, a warm-up, then `--rounds` publishes per replica
    applied `group` batches a call; the timed part is the last."""
    feeds = feeds_of(shapes, args.replicas, ring, args.held_blocks)
    router = Router(RouterConfig())
    for feed in feeds:
        router.apply_snapshot(feed.snapshot())
    for _ in range(args.warmup_rounds):
        router.apply_batches([feed.next_batch() for feed in feeds])
    batches: list[EventBatch] = [feed.next_batch() for _ in range(args.rounds) for feed in feeds]
    num_blocks = sum(len(e.block_hashes) for b in batches for e in b.events)
    cpu0 = time.process_time()
    for start in range(0, len(batches), group):
        assert not any(router.apply_batches(batches[start:start + group]))
    cpu_s = time.process_time() - cpu0
    router.index.check_invariants()
    return {"group_batches": group, "num_batches": len(batches), "num_blocks": num_blocks,
            "blocks_per_s": round(num_blocks / cpu_s), "us_per_batch": round(
                1e6 * cpu_s / len(batches), 1), "ns_per_block": round(1e9 * cpu_s / num_blocks)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=256)
    p.add_argument("--groups", default="1,16,64,256,1024",
                   help="comma-separated batches a call")
    p.add_argument("--held-blocks", type=int, default=2048, help="each replica's snapshot")
    p.add_argument("--warmup-rounds", type=int, default=25)
    p.add_argument("--rounds", type=int, default=25, help="timed publishes per replica")
    p.add_argument("--ring-blocks", type=int, default=1 << 20)
    p.add_argument("--capture-arrivals-s", type=float, default=60.0)
    args = p.parse_args(argv)
    shapes = capture_shapes(arrivals_s=args.capture_arrivals_s)
    print(f"shapes: {json.dumps(shapes.summary())}", flush=True)
    ring = hash_ring(args.ring_blocks)
    rows = []
    for group in (int(x) for x in args.groups.split(",")):
        row = run_group(shapes, args, ring, group)
        print(json.dumps(row), flush=True)
        rows.append(row)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime: {load}")
    out = {"bench": "mirror_apply", "replicas": args.replicas, "shapes": shapes.summary(),
           "runs": rows, "uptime": load,
           "blocks_per_s": {r["group_batches"]: r["blocks_per_s"] for r in rows}}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
