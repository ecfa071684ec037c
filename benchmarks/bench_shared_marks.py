"""What sharing pending marks and routed work between routers costs one router's decisions.

    python benchmarks/bench_shared_marks.py [--quick] [--peers G-1] [--replicas N]

Three routers built from the same index (bench_router.py's forest of prefixes: 64 replicas,
1,000,000 blocks, 512-block prompts, a simulated clock advancing 5 ms per decision) decide
the same prompts, in turn: one alone; one sharing pending marks; one sharing marks and
routed work. After each decision the sharing ones receive one poll reply with what
`--peers` other routers shared meanwhile (each a prompt of the same mix on a random
replica; with work, its charge, and the end of a peer request routed ~256 decisions
earlier), applied as the index mirror applies them (router/cluster/mark_sharing.py
`apply_shared_marks`, under the lock decisions take). They also queue each decision for
sending (`MarkSender.share`: the routing path's only added work, with the work's charge
read from the load; the send itself runs after, on the event loop) and, with work, each
end (`share_end`).

Prints a table, then one JSON line: decision p50/p99 of each (wall and thread CPU), the
sharing ones' CPU ratios to the lone router's, the cost of applying one poll reply and of
queueing one share.
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
from router.cluster.remote_work import RemoteWork  # noqa: E402
from router.cluster.shared_marks import RoutedWork, SharedMark, WorkEnd  # noqa: E402
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
    names = ("alone", "marks", "marks+work")
    routers = {}
    for name in names:
        routers[name] = Router(RouterConfig(block_size=BLOCK_SIZE), clock=lambda: sim_now[0])
        feed(routers[name], prepare(held, random.Random(args.seed + 1)))
    remote = RemoteWork(routers["marks+work"].loads, clock=lambda: sim_now[0])
    gc.collect()
    senders = {name: MarkSender("bench", ActorLink("bench", lambda: None),
                                MarkSharingConfig(share_work=name == "marks+work"))
               for name in names[1:]}

    perf, cpu = time.perf_counter_ns, time.thread_time_ns
    wall = {name: [] for name in routers}
    cpus = {name: [] for name in routers}
    apply_ns: dict[str, list[int]] = {name: [] for name in senders}
    share_ns: dict[str, list[int]] = {name: [] for name in senders}
    in_flight: list[tuple[str, str]] = []  # (route id, its replica)
    peers_in_flight: list[tuple[str, str]] = []
    num_marked = 0
    load_before = os.getloadavg()[0]
    for i, (_, hashes) in enumerate(prompts):
        sim_now[0] += 0.005
        rid = f"q{i}"
        for name, router in routers.items():
            c0, t0 = cpu(), perf()
            decision = router.route(rid, hashes, PROMPT_BLOCKS * BLOCK_SIZE, replica_ids, 256)
            if name in senders:
                t1 = perf()
                charge = router.loads.charge(rid) if name == "marks+work" else None
                senders[name].share(decision.replica_id, hashes,
                                    None if charge is None else RoutedWork(rid, *charge))
                share = perf() - t1
            elapsed, cpu_elapsed = perf() - t0, cpu() - c0
            if i >= 500:
                wall[name].append(elapsed)
                cpus[name].append(cpu_elapsed)
                if name in senders:
                    share_ns[name].append(share)
        marks = []
        for j in range(i * args.peers, (i + 1) * args.peers):
            peer_id = f"p{j}"
            marks.append(SharedMark(peer_replicas[j], tuple(peer_prompts[j][1]),
                                    RoutedWork(peer_id, 4352.0, 256.0, 4352.0)))
            peers_in_flight.append((peer_id, peer_replicas[j]))
            if len(peers_in_flight) > 256 * args.peers:
                marks.append(WorkEnd(*peers_in_flight.pop(0)))
        for name, sender in senders.items():
            sender.outbox.take()  # sent: the event loop's job, not the decision's
            reply = (tuple(m._replace(work=None) for m in marks if isinstance(m, SharedMark))
                     if name == "marks" else tuple(marks))
            t0 = perf()
            marked = apply_shared_marks(routers[name], reply, lambda _: False,
                                        remote if name == "marks+work" else None)
            if i >= 500:
                apply_ns[name].append(perf() - t0)
            num_marked += marked
        in_flight.append((rid, decision.replica_id))
        if len(in_flight) > 256:  # ~256 requests outstanding at any time
            done, done_replica_id = in_flight.pop(0)
            for name, router in routers.items():
                router.on_finished(done)
                if name == "marks+work":
                    senders[name].share_end(done, done_replica_id)
    load_after = os.getloadavg()[0]
    for v in (*wall.values(), *cpus.values(), *apply_ns.values(), *share_ns.values()):
        v.sort()
    pending = {name: len(r.index.pending) for name, r in routers.items()}
    remote.check_invariants()

    print(f"{args.replicas} replicas, {target_blocks:,} blocks, {len(wall['alone']):,} "
          f"decisions of 512-block prompts, {args.peers} peer router(s) sharing; load average "
          f"{load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} CPUs")
    print(f"{'(us)':<28}{'wall p50':>10}{'p99':>9}{'cpu p50':>9}{'p99':>9}{'marks':>9}")
    for name in routers:
        print(f"{'decision, ' + name:<28}{pct(wall[name], .5):>10.1f}"
              f"{pct(wall[name], .99):>9.1f}{pct(cpus[name], .5):>9.1f}"
              f"{pct(cpus[name], .99):>9.1f}{pending[name]:>9,}")
    for name in senders:
        print(f"{'apply one reply, ' + name:<28}{pct(apply_ns[name], .5):>10.1f}"
              f"{pct(apply_ns[name], .99):>9.1f}")
        print(f"{'queue one share, ' + name:<28}{pct(share_ns[name], .5):>10.2f}"
              f"{pct(share_ns[name], .99):>9.2f}")
    print(f"({args.peers} peer marks a reply, {num_marked / len(prompts) / 2:.0f} blocks marked "
          f"a reply; {len(remote)} peer routes counted at the end)")
    out = {
        "replicas": args.replicas, "blocks": target_blocks, "peers": args.peers,
        "decisions": len(wall["alone"]),
        **{f"decision_{q}_us_{name.replace('+', '_')}": round(pct(wall[name], f), 1)
           for name in routers for q, f in (("p50", .5), ("p99", .99))},
        **{f"decision_cpu_{q}_ratio_{name.replace('+', '_')}": round(
            pct(cpus[name], f) / pct(cpus["alone"], f), 3)
           for name in senders for q, f in (("p50", .5), ("p99", .99))},
        **{f"apply_reply_p50_us_{name.replace('+', '_')}": round(pct(apply_ns[name], .5), 1)
           for name in senders},
        **{f"share_p50_us_{name.replace('+', '_')}": round(pct(share_ns[name], .5), 2)
           for name in senders},
        "pending_marks": pending,
        "load_1m": [round(load_before, 2), round(load_after, 2)],
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
