"""CPU seconds a million block events cost on their way through the KV index actor, part by
part, as EventBatch objects against packed columns (router/cluster/packed_batches.py), in
one process without Ray (Ray's own cost per call comes on top: bench_index_actor.py).

The replicas replay the simulator's Mooncake batch shapes (benchmarks/simlib/event_shapes.py).
Each round, every replica's next batch is published (objects: a call per replica; packed: a
relay's call per `--relay-replicas` replicas), then G routers poll, each from its own cursors,
and take what came since. Every part is timed with this process's CPU clock, with pickling
as Ray pickles arguments and replies (cloudpickle, protocol 5):

    publisher   pickle the publish calls' arguments
    actor_in    unpickle them, apply (`KVIndex.publish` / `publish_packed`)
    actor_out   per router: build the poll's reply and pickle it (cursors unpickled too)
    router_in   per router: unpickle the reply (and, packed, make its EventBatch objects:
                what a router that applies them needs; a bare poll skips that)

    nice -n 19 .venv/bin/python benchmarks/bench_index_wire.py --replicas 800 --routers 8

Prints, per form, CPU seconds per million block events of each part and the cores that
1M events a second would take (actor: actor_in + G x actor_out); `uptime`; JSON last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from ray import cloudpickle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simlib.event_shapes import (  # noqa: E402
    ReplicaFeed,
    capture_shapes,
    hash_ring,
)
from kv.events import Cursor  # noqa: E402
from router.cluster.index_actor import KVIndex, PollRequest  # noqa: E402
from router.cluster.packed_batches import PackedBatches  # noqa: E402


class Clock:
    """CPU seconds by part."""

    def __init__(self):
        self.cpu_s: Counter[str] = Counter()

    def timed(self, part: str, fn, *args):
        t0 = time.process_time()
        out = fn(*args)
        self.cpu_s[part] += time.process_time() - t0
        return out


def run_form(form: str, shapes, args, ring: list[bytes]) -> dict:
    per = shapes.per_replica
    feeds = [ReplicaFeed(f"b{k}", per[k % len(per)], ring, k * 7919 % len(ring),
                         args.held_blocks, start_batch=k // len(per) * 101)
             for k in range(args.replicas)]
    index = KVIndex()
    for feed in feeds:
        index.publish_snapshot(feed.snapshot(), feed.stats())
    cursors = [{f.replica_id: Cursor(f.epoch, 0) for f in feeds} for _ in range(args.routers)]
    clock, num_blocks, dumps = Clock(), 0, cloudpickle.dumps
    loop = asyncio.new_event_loop()  # KVIndex.poll is a coroutine (waits for nothing here)
    for rnd in range(args.warmup_rounds + args.rounds):
        if rnd == args.warmup_rounds:
            clock, num_blocks = Clock(), 0
        batches = [feed.next_batch() for feed in feeds]
        num_blocks += sum(len(e.block_hashes) for b in batches for e in b.events)
        if form == "objects":
            for feed, batch in zip(feeds, batches):
                call = clock.timed("publisher", dumps, (batch, feed.stats()))
                clock.timed("actor_in", lambda c: index.publish(*cloudpickle.loads(c)), call)
        else:
            for start in range(0, len(feeds), args.relay_replicas):
                group = slice(start, start + args.relay_replicas)
                call = clock.timed("publisher", lambda b, f: dumps(
                    (PackedBatches.pack(b), {x.replica_id: x.stats() for x in f})),
                                   batches[group], feeds[group])
                clock.timed("actor_in",
                            lambda c: index.publish_packed(*cloudpickle.loads(c)), call)
        for mine in cursors:
            request = dumps(PollRequest("router", mine, 0.0, packed=form == "packed"))
            reply = clock.timed("actor_out", lambda r: dumps(loop.run_until_complete(
                index.poll(cloudpickle.loads(r)))), request)
            got = clock.timed("router_in", cloudpickle.loads, reply)
            taken = list(got.batches) + (clock.timed("router_in", got.packed.unpack)
                                         if got.packed is not None else [])
            for batch in taken:
                mine[batch.replica_id] = Cursor(batch.epoch, batch.next_seq)
    loop.close()
    per_m = 1e6 / num_blocks
    parts = {part: round(s * per_m, 3) for part, s in sorted(clock.cpu_s.items())}
    actor = parts["actor_in"] + parts["actor_out"]
    return {"form": form, "replicas": args.replicas, "routers": args.routers,
            "num_blocks": num_blocks, "cpu_s_per_m_events": parts,
            "actor_cores_at_1m_per_s": round(actor, 2),
            "router_cores_at_1m_per_s": round(parts["router_in"] / args.routers, 3)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=800)
    p.add_argument("--routers", type=int, default=8)
    p.add_argument("--relay-replicas", type=int, default=40,
                   help="replicas a packed publish carries (a relay's)")
    p.add_argument("--held-blocks", type=int, default=2048)
    p.add_argument("--warmup-rounds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--capture-arrivals-s", type=float, default=60.0)
    args = p.parse_args(argv)
    shapes = capture_shapes(arrivals_s=args.capture_arrivals_s)
    ring = hash_ring(1 << 20)
    rows = []
    for form in ("objects", "packed"):
        row = run_form(form, shapes, args, ring)
        print(json.dumps(row), flush=True)
        rows.append(row)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime: {load}")
    out = {"bench": "index_wire", "shapes": shapes.summary(), "runs": rows, "uptime": load}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
