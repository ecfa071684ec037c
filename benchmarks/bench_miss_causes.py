"""What the miss causes cost a router: on the decision, at the request's end, in memory.

The router of bench_router.py (64 replicas, 100,000 indexed blocks by default, 512-block
prompts: deep hits, partial hits, misses) routes each prompt and ends it with the engine's
delivered count; every other request ends without one (as one whose engine reported none),
so the two kinds of end are timed side by side in one run. Timed apart:

    decision_us          Router.route(), the causes' bookkeeping included
    causes_on_route_us   that bookkeeping alone (MissCauses.on_route: keep the view)
    end_with_causes_us   Router.on_finished(id, delivered): classifies, feeds the window
    end_without_us       Router.on_finished(id): no delivered count, nothing classified

Then the seen window is filled to its default capacity with fresh 16-byte hashes and its
memory traced (bytes per remembered block, the hashes' own objects included).

    python benchmarks/bench_miss_causes.py [--decisions N] [--blocks N]

Prints a table, then as the last line one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
import tracemalloc
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
from router.core.miss_causes import MissTokens, SeenWindow  # noqa: E402
from router.core.router import Router, RouterConfig  # noqa: E402


def window_bytes_per_block(capacity_blocks: int) -> float:
    """Traced bytes of a full window, hashes included, per block it holds."""
    rng = random.Random(7)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    prompts = [[rng.randbytes(16) for _ in range(PROMPT_BLOCKS)]
               for _ in range(capacity_blocks // PROMPT_BLOCKS)]
    window = SeenWindow(capacity_blocks)
    for hashes in prompts:
        window.add(hashes)
    del prompts  # what is left is the window and the hashes it keeps
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / len(window)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decisions", type=int, default=4000)
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    replica_ids = [f"replica-{i:02d}" for i in range(args.replicas)]
    chains = make_chains(rng, args.blocks)
    prompts = make_prompts(rng, chains, args.decisions + 500)
    now = [0.0]
    config = RouterConfig(block_size=BLOCK_SIZE)
    router = Router(config, clock=lambda: now[0])
    feed(router, prepare(assign(rng, chains, replica_ids), random.Random(args.seed + 1)))
    gc.collect()

    # the causes' bookkeeping on the decision path, timed inside each route() call
    on_route = router.misses.on_route
    on_route_ns: list[int] = []

    def timed_on_route(*a) -> None:
        start = time.thread_time_ns()
        on_route(*a)
        on_route_ns.append(time.thread_time_ns() - start)

    router.misses.on_route = timed_on_route
    cpu = time.thread_time_ns
    decision_ns: list[int] = []
    end_ns: dict[bool, list[int]] = {True: [], False: []}
    in_flight: list[tuple[str, int]] = []
    load_before = os.getloadavg()[0]
    for i, (_, hashes) in enumerate(prompts):
        now[0] += 0.005
        start = cpu()
        decision = router.route(f"q{i}", hashes, PROMPT_BLOCKS * BLOCK_SIZE, replica_ids, 256)
        elapsed = cpu() - start
        predicted = decision.predicted_device_hit_tokens + decision.predicted_host_hit_tokens
        in_flight.append((f"q{i}", predicted))
        if len(in_flight) > 256:  # ~256 requests outstanding at any time
            rid, delivered = in_flight.pop(0)
            with_count = i % 2 == 0
            start = cpu()
            router.on_finished(rid, delivered if with_count else None)
            if i >= 500:
                end_ns[with_count].append(cpu() - start)
        if i >= 500:  # warm-up excluded
            decision_ns.append(elapsed)
    load_after = os.getloadavg()[0]
    on_route_ns = on_route_ns[500:]  # one per route() call: the warm-up excluded
    for v in (decision_ns, on_route_ns, *end_ns.values()):
        v.sort()
    totals: MissTokens = router.misses.totals
    bytes_per_block = window_bytes_per_block(config.seen_window_blocks)
    out = {
        "replicas": args.replicas, "indexed_blocks": args.blocks,
        "prompt_blocks": PROMPT_BLOCKS, "decisions": len(decision_ns),
        "decision_us_p50": pct(decision_ns, 0.5), "decision_us_p99": pct(decision_ns, 0.99),
        "causes_on_route_us_p50": pct(on_route_ns, 0.5),
        "causes_on_route_us_p99": pct(on_route_ns, 0.99),
        "end_with_causes_us_p50": pct(end_ns[True], 0.5),
        "end_with_causes_us_p99": pct(end_ns[True], 0.99),
        "end_without_us_p50": pct(end_ns[False], 0.5),
        "end_without_us_p99": pct(end_ns[False], 0.99),
        "seen_window_blocks": config.seen_window_blocks,
        "seen_window_bytes_per_block": round(bytes_per_block, 1),
        "seen_window_mib_full": round(bytes_per_block * config.seen_window_blocks / 2**20, 1),
        "causes_tokens": totals._asdict(),
        "load_avg_1m": [round(load_before, 2), round(load_after, 2)],
    }
    for key in ("decision_us", "causes_on_route_us", "end_with_causes_us", "end_without_us"):
        print(f"{key:24s} p50 {out[key + '_p50']:9.2f}   p99 {out[key + '_p99']:9.2f}")
    print(f"seen window: {bytes_per_block:.1f} bytes per block, "
          f"{out['seen_window_mib_full']} MiB at {config.seen_window_blocks} blocks")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
