"""What one index-actor call costs through Ray and as a fast call over ZMQ
(router/cluster/fast_calls.py), side by side on one actor.

The call is a router's poll with nothing new (wait 0), then a replica's publish of an empty
batch with its stats: the calls a request makes on the default path, with what the actor
does for them. CPU per call of the actor's process and of this caller, and wall time a call,
one call at a time, the two ways alternating over `--rounds`.

    python benchmarks/bench_fast_calls.py [--calls 2000 --rounds 3 --replicas 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import ray

from kv.events import Cursor, EventBatch, EventLog
from protocol.engine import EngineStats
from router.cluster.fast_calls import reach_fast_calls
from router.cluster.index_actor import KVIndex
from router.cluster.poll_messages import PollRequest


class _Measured(KVIndex):
    def cpu_s(self) -> float:
        times = os.times()
        return times.user + times.system


async def _measure(actor, handle, args, calls: int) -> dict:
    """Per call: the actor's CPU, this process's CPU, wall time (us)."""
    before_actor = await actor.cpu_s.remote()
    before_cpu, before_wall = time.process_time(), time.perf_counter()
    for i in range(calls):
        if i % 2:
            await handle.poll.remote(args["poll"])
        else:
            await handle.publish.remote(*args["publish"])
    wall_s, cpu_s = time.perf_counter() - before_wall, time.process_time() - before_cpu
    actor_s = await actor.cpu_s.remote() - before_actor
    return {"actor_cpu_us": actor_s / calls * 1e6, "caller_cpu_us": cpu_s / calls * 1e6,
            "wall_us": wall_s / calls * 1e6}


async def _run(args) -> dict:
    actor = ray.remote(num_cpus=0, max_concurrency=1000)(_Measured).remote()
    replica_ids = [f"r{i}" for i in range(args.replicas)]
    for rid in replica_ids:
        await actor.publish_snapshot.remote(EventLog(rid, epoch="e0").snapshot([]))
    fast = await asyncio.to_thread(reach_fast_calls, actor)
    if fast is actor:
        raise SystemExit("the fast calls did not answer")
    snapshots = (await actor.poll.remote(PollRequest("bench", {}))).snapshots
    call_args = {
        "poll": PollRequest("bench", {s.replica_id: Cursor(s.epoch, s.next_seq)
                                      for s in snapshots}),
        "publish": (EventBatch(replica_ids[0], "e0", 0, ()), EngineStats(1, *[0] * 9)),
    }
    rows: dict[str, list[dict]] = {"ray": [], "fast": []}
    for _ in range(args.rounds):
        for name, handle in (("ray", actor), ("fast", fast)):
            await _measure(actor, handle, call_args, args.calls // 10)  # warm
            rows[name].append(await _measure(actor, handle, call_args, args.calls))
    fast.close()
    out = {name: {key: round(statistics.median(r[key] for r in runs), 1) for key in runs[0]}
           for name, runs in rows.items()}
    total = {name: out[name]["actor_cpu_us"] + out[name]["caller_cpu_us"] for name in out}
    out["cpu_ratio_fast_over_ray"] = round(total["fast"] / total["ray"], 3)
    out.update(calls=args.calls, rounds=args.rounds, replicas=args.replicas,
               load_avg_1m=round(os.getloadavg()[0], 2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="per way and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        print(json.dumps(asyncio.run(_run(args))))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
