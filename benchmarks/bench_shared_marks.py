"""What sharing pending marks between routers costs one router's decisions, side by side.

    python benchmarks/bench_shared_marks.py [--quick] [--peers G-1] [--replicas N]

Two routers built from the same index (bench_router.py's forest of prefixes: 64 replicas,
1,000,000 blocks, 512-block prompts, a simulated clock advancing 5 ms per decision) decide
the same prompts, alternately: one alone, the other also receiving, after each decision,
one poll reply with the marks `--peers` other routers set meanwhile (each a prompt of the
same mix on a random replica), applied as the index mirror applies them
(router/cluster/mark_sharing.py `apply_shared_marks`, under the lock decisions take). The
second also queues each decision's marks for sending (`MarkSender.share`, the routing
path's only added work; the send itself runs after, on the event loop).

Prints a table, then one JSON line: decision p50/p99 without and with sharing (wall and
thread CPU), their ratio, the cost of applying one poll reply and of queueing one share.
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

from benchmarks.bench_router import (  # noqa: E402
    BLOCK_SIZE,
    PROMPT_BLOCKS,
    assign,
    feed,
    make_chains,
    make_prompts,
    pct,
    prepare,
)
from router.cluster.actor_link import ActorLink  # noqa: E402
from router.cluster.mark_sharing import MarkSender, MarkSharingConfig, apply_shared_marks  # noqa
from router.cluster.shared_marks import SharedMark  # noqa: E402
from router.core.router import Router, RouterConfig  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100k blocks, 2,000 decisions")
    ap.add_argument("--decisions", type=int, default=None)
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=None)
    ap.add_argument("--peers", type=int, default=1, help="other routers sharing their marks")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    target_blocks = args.blocks or (100_000 if args.quick else 1_000_000)
    num_decisions = args.decisions or (2_000 if args.quick else 20_000)
    rng = random.Random(args.seed)
    replica_ids = [f"replica-{i:02d}" for i in range(args.replicas)]
    chains = make_chains(rng, target_blocks)
    held = assign(rng, chains, replica_ids)
    prompts = make_prompts(rng, chains, num_decisions + 500)
    peer_prompts = make_prompts(rng, chains, (num_decisions + 500) * args.peers)
    peer_replicas = [rng.choice(replica_ids) for _ in peer_prompts]

    sim_now = [0.0]
    routers = {}
    for name in ("alone", "sharing"):
        routers[name] = Router(RouterConfig(block_size=BLOCK_SIZE), clock=lambda: sim_now[0])
        feed(routers[name], prepare(held, random.Random(args.seed + 1)))
    gc.collect()
    sender = MarkSender("bench", ActorLink("bench", lambda: None), MarkSharingConfig())

    perf, cpu = time.perf_counter_ns, time.thread_time_ns
    wall = {name: [] for name in routers}
    cpus = {name: [] for name in routers}
    apply_ns: list[int] = []
    share_ns: list[int] = []
    in_flight: list[str] = []
    num_marked = 0
    load_before = os.getloadavg()[0]
    for i, (_, hashes) in enumerate(prompts):
        sim_now[0] += 0.005
        rid = f"q{i}"
        for name, router in routers.items():
            c0, t0 = cpu(), perf()
            decision = router.route(rid, hashes, PROMPT_BLOCKS * BLOCK_SIZE, replica_ids, 256)
            if name == "sharing":
                t1 = perf()
                sender.share(decision.replica_id, hashes)
                share = perf() - t1
            elapsed, cpu_elapsed = perf() - t0, cpu() - c0
            if i >= 500:
                wall[name].append(elapsed)
                cpus[name].append(cpu_elapsed)
        if i >= 500:
            share_ns.append(share)
        sender.outbox.take()  # sent: the event loop's job, not the decision's
        reply = tuple(SharedMark(peer_replicas[j], tuple(peer_prompts[j][1]))
                      for j in range(i * args.peers, (i + 1) * args.peers))
        t0 = perf()
        num_marked += apply_shared_marks(routers["sharing"], reply, lambda _: False)
        if i >= 500:
            apply_ns.append(perf() - t0)
        in_flight.append(rid)
        if len(in_flight) > 256:  # ~256 requests outstanding at any time
            done = in_flight.pop(0)
            for router in routers.values():
                router.on_finished(done)
    load_after = os.getloadavg()[0]
    for v in (*wall.values(), *cpus.values(), apply_ns, share_ns):
        v.sort()
    pending = {name: len(r.index.pending) for name, r in routers.items()}

    print(f"{args.replicas} replicas, {target_blocks:,} blocks, {len(wall['alone']):,} "
          f"decisions of 512-block prompts, {args.peers} peer router(s) sharing; load average "
          f"{load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} CPUs")
    print(f"{'(us)':<24}{'wall p50':>10}{'p99':>9}{'cpu p50':>9}{'p99':>9}{'marks':>9}")
    for name in routers:
        print(f"{'decision, ' + name:<24}{pct(wall[name], .5):>10.1f}"
              f"{pct(wall[name], .99):>9.1f}{pct(cpus[name], .5):>9.1f}"
              f"{pct(cpus[name], .99):>9.1f}{pending[name]:>9,}")
    print(f"{'apply one poll reply':<24}{pct(apply_ns, .5):>10.1f}{pct(apply_ns, .99):>9.1f}"
          f"   ({args.peers} marks, {num_marked / len(prompts):.0f} blocks marked a reply)")
    print(f"{'queue one share':<24}{pct(share_ns, .5):>10.2f}{pct(share_ns, .99):>9.2f}")
    out = {
        "replicas": args.replicas, "blocks": target_blocks, "peers": args.peers,
        "decisions": len(wall["alone"]),
        "decision_p50_us_alone": round(pct(wall["alone"], .5), 1),
        "decision_p99_us_alone": round(pct(wall["alone"], .99), 1),
        "decision_p50_us_sharing": round(pct(wall["sharing"], .5), 1),
        "decision_p99_us_sharing": round(pct(wall["sharing"], .99), 1),
        "decision_cpu_p50_ratio": round(pct(cpus["sharing"], .5) / pct(cpus["alone"], .5), 3),
        "decision_cpu_p99_ratio": round(pct(cpus["sharing"], .99) / pct(cpus["alone"], .99),
                                        3),
        "apply_reply_p50_us": round(pct(apply_ns, .5), 1),
        "apply_reply_p99_us": round(pct(apply_ns, .99), 1),
        "share_p50_us": round(pct(share_ns, .5), 2),
        "pending_marks_alone": pending["alone"], "pending_marks_sharing": pending["sharing"],
        "load_1m": [round(load_before, 2), round(load_after, 2)],
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
