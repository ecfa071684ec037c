"""How many block events a second one KV index actor takes in and fans out to G mirrors.

Real Ray: the `kvroute-index` actor's class (router/cluster/index_actor.py), publisher
processes that each play many replicas, and G mirror processes, each a bare poll loop that
only takes the replies (`--mirror receive`, the default: the actor's cost alone) or a real
`IndexMirror` long-polling the actor into a real `Router` (`--mirror router`: the routers'
apply cost too). `--shards N` splits the index by replica over N actors; each mirror then
follows every shard (one IndexMirror per shard, into its one Router). `--calls ray,fast`:
the publishers and mirrors call the shards through Ray, or as the product finds the index
actor (`find_index`): its per-request calls and a relay's `publish_packed` over the actor's
ZMQ socket (router/cluster/fast_calls.py); snapshots and setup calls stay on Ray.

The replicas replay batches shaped like the simulator's (benchmarks/simlib/event_shapes.py:
Mooncake at twice the trace's rate, about 1,230 block events a second per busy replica, as
the issue's 10k prefill tokens a second), every 50 ms like router/serve/publisher.py, with
one publish in flight per replica: a tick that finds the previous publish unanswered
leaves its events for the next one, as the engine's log would. `--events-per-s` picks the
number of replicas.

    flock /tmp/kvroute-heavy.lock timeout 900 .venv/bin/python benchmarks/bench_index_actor.py
    ... --events-per-s 100000 --mirror receive,router --shards 1,2 --mirrors 1,8

The default is the issue's target: 1M block events/s offered (about 800 replicas), G = 1
and 8. Prints, per combination: block events offered, ingested by the actor (acknowledged)
and taken by each mirror, a second; the lag from an event's publish tick until each mirror
has it (p50, p99, and events no mirror had by the end); the CPU seconds each process spent
per million block events; `uptime`. The JSON line last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simlib.event_shapes import Shapes, capture_shapes  # noqa: E402
from benchmarks.simlib.index_feed import FeedPublisher, MirrorProbe  # noqa: E402
from router.cluster.index_actor import IndexActor, IndexActorConfig  # noqa: E402


def lags_s(published: dict, received: dict, end_s: float) -> tuple[np.ndarray, int]:
    """Per published batch with events: the time until this mirror had it (it had the
    replica's cursor at or past the batch's next_seq); batches it never had count up to
    `end_s` and are returned as missed."""
    key = published["replica"].astype(np.int64) << 32 | published["next_seq"]
    got = received["replica"].astype(np.int64) << 32 | received["next_seq"]
    order = np.argsort(got, kind="stable")
    got, got_t = got[order], received["t"][order]
    i = np.searchsorted(got, key, side="left")
    found = i < len(got)
    found[found] = (got[i[found]] >> 32) == (key[found] >> 32)
    t_recv = np.where(found, got_t[np.minimum(i, len(got) - 1)], end_s)
    return t_recv - published["t"], int((~found).sum())


def cpu_s(pids: list[int]) -> list[float]:
    out = []
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        out.append(t.user + t.system)
    return out


def run_one(shapes: Shapes, num_replicas: int, num_mirrors: int, num_shards: int,
            mirror: str, publish: str, calls: str, args) -> dict:
    shards = [IndexActor.remote(IndexActorConfig()) for _ in range(num_shards)]
    ray.get([index.get_incarnation.remote() for index in shards])
    ids = [f"b{k}" for k in range(num_replicas)]
    pubs = [FeedPublisher.remote(ids[p::args.publishers], shapes.per_replica, args.ring_blocks,
                                 args.held_blocks) for p in range(args.publishers)]
    mirrors = [MirrorProbe.remote(f"mirror-{g}", mirror == "router", args.poll == "packed",
                                  args.poll_interval_s)
               for g in range(num_mirrors)]
    ray.get([m.start.remote(shards, calls) for m in mirrors]
            + [p.connect.remote(shards, calls) for p in pubs])
    # The replicas' first snapshots, then the run once every mirror has them all.
    setup_s = time.time()
    ray.get([p.publish_snapshots.remote() for p in pubs])
    setup_deadline_s = time.time() + 120.0
    while not all(ray.get([m.wait_replicas.remote(num_replicas, 1.0) for m in mirrors])):
        if time.time() > setup_deadline_s:
            raise RuntimeError("the mirrors did not have every replica's snapshot in 120 s")
        # 8 mirrors taking 800 snapshots can outlast the actor's replica_timeout_s (10 s)
        # on a busy box: the replicas heartbeat meanwhile, as real ones do, or the actor
        # would forget them all and the run would be a storm of snapshots
        ray.get([p.heartbeat.remote() for p in pubs])
    setup_s = time.time() - setup_s
    pids = ray.get([index.__ray_call__.remote(lambda _self: os.getpid()) for index in shards]
                   + [m.pid.remote() for m in mirrors] + [p.pid.remote() for p in pubs])
    cpu0 = cpu_s(pids)
    spy = None
    if args.profile:  # py-spy on the index actor for the run, as collapsed stacks
        out = (Path(args.profile)
               / f"index_actor_{mirror}_{calls}_S{num_shards}_G{num_mirrors}.txt")
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p",
                                str(pids[0]), "-d", str(int(args.duration_s)), "-r", "50",
                                "-f", "raw", "-o", str(out)], stdout=subprocess.DEVNULL)
    start_s = time.time() + 1.0
    sent = ray.get([p.run.remote(start_s, args.duration_s, shapes.publish_interval_s,
                                 publish == "relay") for p in pubs])
    final = {}
    for s in sent:
        final.update(s["final_seq"])
    deadline = time.time() + args.drain_s
    caught_up = False
    while time.time() < deadline and not caught_up:
        caught_up = all(ray.get([m.caught_up.remote(final) for m in mirrors]))
        if not caught_up:
            time.sleep(0.1)  # polling the probes' progress, not standing in for a signal
    end_s = time.time()
    cpu1 = cpu_s(pids)
    if spy is not None:
        spy.wait()
    received = ray.get([m.take_records.remote() for m in mirrors])
    ray.get([m.stop.remote() for m in mirrors])
    published = {k: np.concatenate([s["published"][k] for s in sent])
                 for k in ("replica", "next_seq", "t")}
    offered = sum(s["num_blocks_due"] for s in sent)
    acked = sum(s["num_blocks_acked"] for s in sent)
    last_ack_s = max(s["last_ack_s"] for s in sent)
    all_lags, missed = [], 0
    mirror_rates = []
    for r in received:
        lag, miss = lags_s(published, r, end_s)
        all_lags.append(lag)
        missed += miss
        span_s = (r["last_s"] or end_s) - start_s
        mirror_rates.append(r["num_blocks"] / span_s)
    lag = np.concatenate(all_lags)
    used = [b - a for a, b in zip(cpu0, cpu1)]
    actor_cpu, mirror_cpu = used[:num_shards], used[num_shards:num_shards + num_mirrors]
    for actor in mirrors + pubs + shards:
        ray.kill(actor)
    per_m = 1e6 / max(acked, 1)
    num_publishes = sum(s["num_publishes"] for s in sent)
    return {
        "mirror": mirror, "publish": publish, "poll": args.poll, "calls": calls,
        "poll_interval_s": args.poll_interval_s,
        "mirrors": num_mirrors,
        "shards": num_shards,
        "replicas": num_replicas,
        "duration_s": args.duration_s,
        "setup_s": round(setup_s, 1),  # the replicas' snapshots until every mirror had them
        "offered_events_per_s": round(offered / args.duration_s),
        "events_per_s": round(acked / (last_ack_s - start_s)),
        "mirror_events_per_s_min": round(min(mirror_rates)),
        "publishes_per_s": round(num_publishes / args.duration_s),
        # each mirror's polls a second, over the run and its drain
        "mirror_polls_per_s": round(sum(int((r["poll_t"] >= start_s).sum()) for r in received)
                                    / num_mirrors / (end_s - start_s), 1),
        "mirror_lag_p50_s": round(float(np.percentile(lag, 50)), 4),
        "mirror_lag_p99_s": round(float(np.percentile(lag, 99)), 4),
        "mirror_lag_max_s": round(float(lag.max()), 4),
        "batches_missed": missed, "caught_up": caught_up,
        "snapshots_asked": sum(s["num_snapshots"] for s in sent),
        # failed calls: publishes (their blocks not counted as taken), bare mirrors' polls
        "call_errors": sum(s["num_errors"] for s in sent) + sum(r["num_errors"]
                                                                for r in received),
        "actor_cpu_s_per_m_events": round(sum(actor_cpu) * per_m, 3),
        "actor_cpu_us_per_publish": round(1e6 * sum(actor_cpu) / max(num_publishes, 1)),
        "actor_busiest_core_share": round(max(actor_cpu) / (end_s - start_s), 3),
        "mirror_cpu_s_per_m_events": round(sum(mirror_cpu) / num_mirrors * per_m, 3),
        "publisher_cpu_s_per_m_events": round(sum(used[num_shards + num_mirrors:]) * per_m,
                                              3),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events-per-s", type=float, default=1_000_000,
                   help="block events a second offered (sets the number of replicas)")
    p.add_argument("--replicas", type=int, default=None, help="instead of --events-per-s")
    p.add_argument("--mirrors", default="1,8", help="comma-separated G values")
    p.add_argument("--mirror", default="receive",
                   help="comma-separated, of router (an IndexMirror into a Router) and "
                        "receive (poll replies only)")
    p.add_argument("--duration-s", type=float, default=15.0)
    p.add_argument("--drain-s", type=float, default=30.0,
                   help="after the run, wait up to this long for the mirrors to catch up")
    p.add_argument("--shards", default="1",
                   help="comma-separated numbers of index actors (shard k owns the replicas "
                        "whose number is k modulo their count)")
    p.add_argument("--publish", default="relay",
                   help="comma-separated, of replica (a publish call per replica and tick, "
                        "as router/serve/publisher.py does) and relay (each publisher process "
                        "is a node's relay: the replicas due at one phase in one packed call)")
    p.add_argument("--calls", default="ray",
                   help="comma-separated, of ray (every call through Ray) and fast (the "
                        "per-request calls and publish_packed over the actor's ZMQ socket); "
                        "given both, each combination runs with one then the other")
    p.add_argument("--poll", default="packed", choices=("packed", "objects"),
                   help="bare polls' replies as columns or as EventBatch objects")
    p.add_argument("--poll-interval-s", type=float, default=None,
                   help="each mirror's pause between a reply and its next poll (default: "
                        "IndexMirror's, 50 ms at this many replicas)")
    p.add_argument("--publishers", type=int, default=2, help="processes playing the replicas")
    p.add_argument("--held-blocks", type=int, default=2048, help="each replica's snapshot")
    p.add_argument("--ring-blocks", type=int, default=1 << 20)
    p.add_argument("--profile", default=None, help="directory: py-spy the index actor")
    p.add_argument("--capture-arrivals-s", type=float, default=90.0)
    p.add_argument("--shapes-cache", default=None,
                   help="a file: the captured shapes are read from it if it exists, else "
                        "captured and written there (runs in turn replay the same batches "
                        "and skip the minutes of simulation)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    cache = Path(args.shapes_cache) if args.shapes_cache else None
    if cache is not None and cache.exists():
        shapes = pickle.loads(cache.read_bytes())
        if not isinstance(shapes, Shapes):
            raise SystemExit(f"{cache}: not captured shapes")
    else:
        shapes = capture_shapes(arrivals_s=args.capture_arrivals_s)
        if cache is not None:
            cache.write_bytes(pickle.dumps(shapes))
    print(f"shapes: {json.dumps(shapes.summary())} ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    per_replica = shapes.blocks_per_s_per_replica()
    num_replicas = args.replicas or max(1, math.ceil(args.events_per_s / per_replica))
    root = str(Path(__file__).resolve().parents[1])  # the actors import benchmarks.simlib
    ray.init(include_dashboard=False, log_to_driver=False, namespace="bench-index-actor",
             object_store_memory=512 * 1024**2,
             runtime_env={"env_vars": {"PYTHONPATH": root}})
    rows = []
    try:
        for mirror in args.mirror.split(","):
            for publish in args.publish.split(","):
                for num_shards in (int(x) for x in args.shards.split(",")):
                    for g in (int(x) for x in args.mirrors.split(",")):
                        for calls in args.calls.split(","):
                            row = run_one(shapes, num_replicas, g, num_shards, mirror,
                                          publish, calls, args)
                            print(json.dumps(row), flush=True)
                            rows.append(row)
    finally:
        ray.shutdown()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime: {load}")
    def key(r: dict) -> str:
        return (f"{r['mirror']} {r['publish']} {r['calls']} shards={r['shards']} "
                f"G={r['mirrors']}")

    out = {"bench": "index_actor", "shapes": shapes.summary(), "runs": rows, "uptime": load,
           "events_per_s": {key(r): r["events_per_s"] for r in rows},
           "mirror_lag_p99_s": {key(r): r["mirror_lag_p99_s"] for r in rows}}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
