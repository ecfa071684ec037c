"""Where a routing decision's CPU goes: bench_router's fleet and prompts, each part timed.

Builds the index as bench_router.py does (same seeds, so the same fleet and prompts), then
routes the prompts with the router's parts wrapped by a CPU-time counter (thread_time_ns;
about a microsecond per wrapped call, a few per decision). Prints the mean CPU of each part
per decision (parts nest: the indented ones are inside the one above), the decision
percentiles by prompt kind, and the same for the slowest 3% of decisions, then one JSON
line. With --no-gc the cyclic collector is off while routing: its pauses land inside
whatever part allocates when a collection starts, so the difference shows what they cost.

    python benchmarks/router_cpu_parts.py [--replicas 64] [--blocks 1000000] [--decisions N]
                                          [--no-gc]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_router as br  # noqa: E402

from router.core import block_table, history, index, pending, prefix_walk  # noqa: E402
from router.core.policies import cache_aware  # noqa: E402
from router.core.router import Router, RouterConfig  # noqa: E402

PARTS = [  # (owner, method, label): indented labels run inside the part above them
    (Router, "route", "route"),
    (index.PrefixIndex, "match", "  index.match"),
    (block_table.BlockTable, "lookup", "    table.lookup"),
    (prefix_walk.PrefixWalk, "walk", "    walk"),
    (prefix_walk, "_marked", "      pending checks"),
    (prefix_walk.PrefixWalk, "runs", "    runs as arrays"),
    (cache_aware.CacheAwarePolicy, "rank", "  policy.rank"),
    (index.PrefixIndex, "mark_pending", "  mark_pending"),
    (pending.PendingMarks, "expire", "  pending.expire (both)"),
    (history.RoutedHistory, "record", "  history.record"),
    (Router, "on_finished", "on_finished (not timed by bench_router)"),
    (index.PrefixIndex, "release_pending", "  release_pending"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--decisions", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-gc", action="store_true",
                    help="the cyclic collector off while routing (tells its pauses apart)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    replica_ids = [f"replica-{i:02d}" for i in range(args.replicas)]
    chains = br.make_chains(rng, args.blocks)
    held = br.assign(rng, chains, replica_ids)
    prompts = br.make_prompts(rng, chains, args.decisions + 500)
    now = [0.0]
    router = Router(RouterConfig(policy="cache_aware", block_size=br.BLOCK_SIZE),
                    clock=lambda: now[0])
    br.feed(router, br.prepare(held, random.Random(args.seed + 1)))
    gc.collect()

    total_ns: dict[str, int] = {label: 0 for _, _, label in PARTS}
    current_ns: dict[str, int] = {}
    cpu = time.thread_time_ns

    def timed(f, label):
        @functools.wraps(f)
        def wrapper(*a, **kw):
            start = cpu()
            try:
                return f(*a, **kw)
            finally:
                spent = cpu() - start
                total_ns[label] += spent
                current_ns[label] = current_ns.get(label, 0) + spent
        return wrapper

    for owner, name, label in PARTS:
        setattr(owner, name, timed(getattr(owner, name), label))
    decisions: list[tuple[int, str, dict[str, int]]] = []
    in_flight: list[str] = []
    load_before = os.getloadavg()[0]
    gc_pauses = [0, 0]  # collections during the decisions timed, their CPU ns
    gc_start = [0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start[0] = cpu()
        elif len(decisions):
            gc_pauses[0] += 1
            gc_pauses[1] += cpu() - gc_start[0]

    gc.callbacks.append(on_gc)
    if args.no_gc:
        gc.disable()
    for i, (kind, hashes) in enumerate(prompts):
        if i == 500:  # warm-up excluded
            total_ns.update(dict.fromkeys(total_ns, 0))
        now[0] += 0.005
        current_ns.clear()
        router.route(f"q{i}", hashes, br.PROMPT_BLOCKS * br.BLOCK_SIZE, replica_ids, 256)
        if i >= 500:
            decisions.append((current_ns["route"], kind, dict(current_ns)))
        in_flight.append(f"q{i}")
        if len(in_flight) > 256:
            router.on_finished(in_flight.pop(0))
    gc.enable()
    gc.callbacks.remove(on_gc)
    n = len(decisions)
    decisions.sort(key=lambda d: d[0])
    slow = decisions[int(0.97 * n):]

    def pct(q: float, rows=decisions) -> float:
        return rows[min(len(rows) - 1, int(q * len(rows)))][0] / 1000

    print(f"{args.replicas} replicas, {args.blocks:,} blocks, {n} decisions; load average "
          f"{load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; cyclic GC "
          f"{'off' if args.no_gc else 'on'}: {gc_pauses[0]} collections, "
          f"{gc_pauses[1] / 1e6:.1f} ms of CPU in all")
    print(f"{'part':<44}{'mean us':>9}{'slowest 3%':>12}")
    for _, _, label in PARTS:
        slow_mean = sum(d[2].get(label, 0) for d in slow) / len(slow) / 1000
        print(f"{label:<44}{total_ns[label] / n / 1000:>9.1f}{slow_mean:>12.1f}")
    for kind in br.KINDS:
        rows = [d for d in decisions if d[1] == kind]
        print(f"{kind:<12} n={len(rows):<5} cpu p50 {pct(.5, rows):7.1f}  "
              f"p99 {pct(.99, rows):7.1f} us")
    print(json.dumps({
        "replicas": args.replicas, "blocks": args.blocks, "decisions": n,
        "route_cpu_p50_us": round(pct(.5), 1), "route_cpu_p99_us": round(pct(.99), 1),
        "mean_us": {label.strip(): round(total_ns[label] / n / 1000, 1)
                    for _, _, label in PARTS},
        "gc": not args.no_gc, "gc_collections": gc_pauses[0],
        "gc_cpu_ms": round(gc_pauses[1] / 1e6, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
