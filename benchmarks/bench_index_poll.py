"""The KV index actor's CPU per call, in one process (no Ray calls; pickled as Ray does):
a relay's packed publish per million block events, and one router's packed poll at R
replicas when every replica published once since the router's cursors (the steady state
at 50 ms polls), split into the request's unpickling, the reply's making and pickling,
and the mirror's unpickling.

    .venv/bin/python benchmarks/bench_index_poll.py [--replicas 803] [--rounds 15]

Replicas replay the simulator's Mooncake batches (benchmarks/simlib/event_shapes.py), as
bench_index_actor.py's do. Thread CPU time, medians over rounds; prints `uptime`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ray import cloudpickle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simlib.event_shapes import ReplicaFeed, capture_shapes, hash_ring  # noqa: E402
from kv.events import Cursor  # noqa: E402
from router.cluster.index_actor import IndexActorConfig, KVIndex  # noqa: E402
from router.cluster.packed_batches import PackedBatches  # noqa: E402
from router.cluster.poll_messages import PollRequest  # noqa: E402

RELAY_REPLICAS = 80  # replicas a relay's call carries


async def run(args) -> dict:
    shapes = capture_shapes(arrivals_s=args.capture_arrivals_s)
    ring = hash_ring(1 << 20)
    feeds = [ReplicaFeed(f"b{k}", shapes.per_replica[k % len(shapes.per_replica)], ring,
                         offset=k * 7919 % (1 << 20), held_blocks=2048,
                         start_batch=k // len(shapes.per_replica) * 101)
             for k in range(args.replicas)]
    index = KVIndex(IndexActorConfig(replica_timeout_s=1e9))
    for feed in feeds:
        index.publish_snapshot(feed.snapshot(), feed.stats())
    reply = await index.poll(PollRequest("m0", {}, 0.0, packed=True))
    cursors = {s.replica_id: Cursor(s.epoch, s.next_seq) for s in reply.snapshots}
    parts = {k: [] for k in ("request_unpickle", "reply_made", "reply_pickle",
                             "mirror_unpickle")}
    publish_s, num_events, reply_bytes = 0.0, 0, []
    for _ in range(args.rounds):
        for lo in range(0, len(feeds), RELAY_REPLICAS):  # every replica publishes once
            chunk = feeds[lo:lo + RELAY_REPLICAS]
            before = sum(f.num_blocks_sent for f in chunk)
            call = cloudpickle.dumps((PackedBatches.pack([f.next_batch(1) for f in chunk]),
                                      {f.replica_id: f.stats() for f in chunk}), protocol=5)
            num_events += sum(f.num_blocks_sent for f in chunk) - before
            t = time.thread_time()
            index.publish_packed(*pickle.loads(call))
            publish_s += time.thread_time() - t
        data = cloudpickle.dumps(PollRequest("m0", dict(cursors), 0.0, packed=True), protocol=5)
        for name, step in (("request_unpickle", lambda d: pickle.loads(d)),
                           ("reply_made", None), ("reply_pickle", None),
                           ("mirror_unpickle", None)):
            t = time.thread_time()
            if name == "request_unpickle":
                request = step(data)
            elif name == "reply_made":
                reply = await index.poll(request)
            elif name == "reply_pickle":
                data = cloudpickle.dumps(reply, protocol=5)
            else:
                reply = pickle.loads(data)
            parts[name].append(time.thread_time() - t)
        reply_bytes.append(len(data))
        packed = reply.packed
        for rid, epoch, next_seq in zip(packed.replica_ids, packed.epochs, packed.next_seqs()):
            cursors[rid] = Cursor(epoch, next_seq)
    actor_ms = sum(statistics.median(parts[k]) for k in parts if k != "mirror_unpickle")
    return {"bench": "index_poll", "replicas": args.replicas, "rounds": args.rounds,
            "publish_cpu_s_per_m_events": round(publish_s * 1e6 / num_events, 3),
            **{f"poll_{k}_ms": round(1e3 * statistics.median(v), 2) for k, v in parts.items()},
            "poll_actor_ms": round(1e3 * actor_ms, 2),
            "reply_kb": round(statistics.median(reply_bytes) / 1e3)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=803)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--capture-arrivals-s", type=float, default=60.0)
    args = p.parse_args(argv)
    out = asyncio.run(run(args))
    out["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
