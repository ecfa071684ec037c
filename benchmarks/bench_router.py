"""Router decision latency: 64 replicas, 1,000,000 indexed blocks, 8,192-token prompts.

The index is built the way a router builds it: per replica a snapshot, then event batches
(stores, a few evictions). Contents are a forest of shared prefixes: chains of up to 512
blocks, most branching off an earlier chain at a random depth, each held by a few replicas
(a heavy-tailed number, so popular prefixes sit on many), the deeper part of some on the
host tier. Then `Router.route()` is timed for 512-hash prompts (8,192 tokens, block size
16): deep hits, partial hits at random depths and misses, with finished requests released
so load stays bounded. Decisions run on a simulated clock advancing 5 ms per request (200
requests/s into one router), so pending marks live their full 2 s TTL without events.

    python benchmarks/bench_router.py [--quick] [--decisions N] [--policy NAME]
                                      [--mark-whole-prompt true|false] [--gc-freeze]

    python benchmarks/bench_router.py --replicas 256 --blocks 4000000 --decisions 5000

Prints a table, then as the last line one JSON object. Memory is what a first, traced build
leaves allocated (tracemalloc: every Python object and numpy array the router keeps), and
`index_bytes_per_holding` that divided by the replica holdings (a block held by k replicas,
on one medium each, is k holdings); `build_s` is the time of a second, untraced build
(`build_cpu_s` its process CPU time, which a busy box inflates less). `decisions_sha256`
digests every decision (replica, ranking, predicted hits): two versions of the router that
decide alike print the same digest. `gc_in_decisions*` count the cyclic collector's runs
(any generation) that started inside a timed decision, and their CPU: the decision CPU
percentiles include them (benchmarks/router_cpu_parts.py --no-gc shows the difference). Each
replica's snapshot and events carry their own hash objects, as deserialized ones do.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kv.events import BlockRemoved, BlockStored, EventBatch, EventLog, Snapshot  # noqa: E402
from kv.hashing import DEFAULT_BLOCK_SIZE  # noqa: E402
from router.core.process_policy import freeze_startup_heap  # noqa: E402
from router.core.router import Router, RouterConfig  # noqa: E402

BLOCK_SIZE = DEFAULT_BLOCK_SIZE
PROMPT_BLOCKS = 512  # 8,192 tokens
KINDS = ("deep_hit", "partial_hit", "miss")


def make_chains(rng: random.Random, target_blocks: int) -> list[list[bytes]]:
    """Prefix chains totalling `target_blocks` distinct hashes; most share an earlier
    chain's prefix (slices share the hash objects, as one deserialized event stream would
    not, but the index keeps its own references either way)."""
    chains: list[list[bytes]] = []
    total = 0
    while total < target_blocks:
        prefix: list[bytes] = []
        if chains and rng.random() < 0.7:
            parent = rng.choice(chains)
            prefix = parent[: rng.randint(1, len(parent))]
        room = PROMPT_BLOCKS - len(prefix)
        if room <= 0:
            continue
        own = min(room, int(8 * 64 ** rng.random()), target_blocks - total)  # 8..512
        own = max(own, 1)
        chains.append(prefix + [rng.randbytes(16) for _ in range(own)])
        total += own
    return chains


def assign(rng: random.Random, chains: list[list[bytes]], replica_ids: list[str]
           ) -> dict[str, list[tuple[list[bytes], int]]]:
    """Per replica, (chain, number of its leading blocks on the device; the rest on host)."""
    held: dict[str, list[tuple[list[bytes], int]]] = {r: [] for r in replica_ids}
    for chain in chains:
        k = min(len(replica_ids), int(rng.paretovariate(1.3)))  # 1, sometimes many
        for rid in rng.sample(replica_ids, k):
            on_device = len(chain) if rng.random() < 0.7 else rng.randint(1, len(chain))
            held[rid].append((chain, on_device))
    return held


def copied(hashes) -> tuple[bytes, ...]:
    """Fresh objects, as each replica's deserialized events bring their own."""
    return tuple(bytes(bytearray(x)) for x in hashes)


def prepare(held: dict[str, list[tuple[list[bytes], int]]], rng: random.Random
            ) -> list[tuple[Snapshot, list[EventBatch]]]:
    """Per replica, a snapshot of half its chains, then the rest as event batches of stores
    and some evictions (an eviction, then the tail comes back)."""
    out = []
    for rid, items in held.items():
        log = EventLog(rid, epoch=f"{rid}-e0")
        half = len(items) // 2
        device: set[bytes] = set()
        host: set[bytes] = set()
        for chain, on_device in items[:half]:
            device.update(chain[:on_device])
            host.update(chain[on_device:])
        snapshot = log.snapshot(copied(device), copied(host))
        batches = []
        for n, (chain, on_device) in enumerate(items[half:]):
            log.append(BlockStored(copied(chain[:on_device]), None, "device"))
            if on_device < len(chain):
                log.append(BlockStored(copied(chain[on_device:]), chain[on_device - 1], "host"))
            if rng.random() < 0.05:
                log.append(BlockRemoved(copied(chain[-4:]), "device"))
                log.append(BlockStored(copied(chain[-4:]), None, "device"))
            if n % 64 == 63:
                batches.append(log.drain())
        batches.append(log.drain())
        out.append((snapshot, batches))
    return out


def feed(router: Router, prepared: list[tuple[Snapshot, list[EventBatch]]]) -> int:
    """Applies each replica's snapshot then its batches; returns the number of events."""
    num_events = 0
    for snapshot, batches in prepared:
        assert router.apply_batch(EventBatch(snapshot.replica_id, snapshot.epoch, 0, ()))
        router.apply_snapshot(snapshot)
        for batch in batches:
            assert not router.apply_batch(batch)
            num_events += len(batch.events)
    return num_events


def make_prompts(rng: random.Random, chains: list[list[bytes]], n: int
                 ) -> list[tuple[str, list[bytes]]]:
    deep = [c for c in chains if len(c) >= 384]
    out = []
    for _ in range(n):
        kind = rng.choices(KINDS, weights=(0.3, 0.4, 0.3))[0]
        if kind == "deep_hit":
            prefix = rng.choice(deep)
        elif kind == "partial_hit":
            chain = rng.choice(chains)
            prefix = chain[: rng.randint(1, len(chain))]
        else:
            prefix = []
        fresh = [rng.randbytes(16) for _ in range(PROMPT_BLOCKS - len(prefix))]
        # New objects, as hashes deserialized from the gateway are: a dict lookup then
        # compares key bytes instead of stopping at `is` (one more memory access per hit).
        out.append((kind, [bytes(bytearray(x)) for x in prefix] + fresh))
    return out


def pct(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100k blocks, 2,000 decisions")
    ap.add_argument("--decisions", type=int, default=None)
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=None, help="distinct indexed blocks")
    ap.add_argument("--policy", default="cache_aware")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gc-freeze", action="store_true",
                    help="freeze the heap once built, as a router process does at start "
                         "(router/core/process_policy.py)")
    ap.add_argument("--mark-whole-prompt", choices=("true", "false"), default=None,
                    help="RouterConfig.mark_whole_prompt (default: RouterConfig's)")
    args = ap.parse_args()
    knobs = ({} if args.mark_whole_prompt is None
             else dict(mark_whole_prompt=args.mark_whole_prompt == "true"))
    target_blocks = args.blocks or (100_000 if args.quick else 1_000_000)
    num_decisions = args.decisions or (2_000 if args.quick else 20_000)
    rng = random.Random(args.seed)
    replica_ids = [f"replica-{i:02d}" for i in range(args.replicas)]

    chains = make_chains(rng, target_blocks)
    held = assign(rng, chains, replica_ids)
    prompts = make_prompts(rng, chains, num_decisions + 500)
    gc.collect()

    sim_now = [0.0]

    def new_router() -> Router:
        return Router(RouterConfig(policy=args.policy, block_size=BLOCK_SIZE, **knobs),
                      clock=lambda: sim_now[0])

    # Memory: trace a first build; what stays allocated once the feed's snapshots and
    # batches are gone is the index (with the one hash object per block it keeps).
    tracemalloc.start()
    traced0 = tracemalloc.get_traced_memory()[0]
    prepared = prepare(held, random.Random(args.seed + 1))
    router = new_router()
    feed(router, prepared)
    del prepared
    gc.collect()
    index_bytes = tracemalloc.get_traced_memory()[0] - traced0
    index_mib = index_bytes / 2**20
    tracemalloc.stop()
    del router
    gc.collect()
    # Time: the same feed again, untraced.
    prepared = prepare(held, random.Random(args.seed + 1))
    router = new_router()
    t0, cpu0 = time.perf_counter(), time.process_time()
    num_events = feed(router, prepared)
    build_s, build_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    del prepared
    gc.collect()
    blocks = router.index_blocks()
    holdings = sum(len(router.index.held_view(r, m)) for r in replica_ids
                   for m in ("device", "host"))
    distinct = router.index.num_distinct_blocks()
    if args.gc_freeze:
        freeze_startup_heap()

    wall_ns: dict[str, list[int]] = {k: [] for k in KINDS}
    cpu_ns: dict[str, list[int]] = {k: [] for k in KINDS}  # immune to being descheduled
    hit_tokens: dict[str, int] = {k: 0 for k in KINDS}
    in_flight: list[str] = []
    perf, cpu = time.perf_counter_ns, time.thread_time_ns
    load_before = os.getloadavg()[0]
    gc_pauses_ns: list[int] = []  # full (generation 2) collections during the timed loop
    gc_start = [0, 0]  # wall, CPU
    # every collection (any generation) inside a timed decision: its CPU, which that
    # decision's CPU time includes
    gc_in_decisions_ns: list[int] = []
    in_decision = [False]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start[:] = perf(), cpu()
            return
        if in_decision[0]:
            gc_in_decisions_ns.append(cpu() - gc_start[1])
        if info["generation"] == 2:
            gc_pauses_ns.append(perf() - gc_start[0])

    gc.callbacks.append(on_gc)
    digest = hashlib.sha256()  # every decision, ranking and predicted hits: same code, same digest
    for i, (kind, hashes) in enumerate(prompts):
        sim_now[0] += 0.005
        rid = f"q{i}"
        in_decision[0] = i >= 500  # warm-up excluded
        cpu_start = cpu()
        start = perf()
        decision = router.route(rid, hashes, PROMPT_BLOCKS * BLOCK_SIZE, replica_ids, 256)
        elapsed = perf() - start
        cpu_elapsed = cpu() - cpu_start
        in_decision[0] = False
        digest.update(repr(decision).encode())
        in_flight.append(rid)
        if len(in_flight) > 256:  # ~256 requests outstanding at any time
            router.on_finished(in_flight.pop(0))
        if i >= 500:  # warm-up excluded
            wall_ns[kind].append(elapsed)
            cpu_ns[kind].append(cpu_elapsed)
            hit_tokens[kind] += decision.predicted_device_hit_tokens
    load_after = os.getloadavg()[0]
    gc.callbacks.remove(on_gc)
    max_gc_us = max(gc_pauses_ns, default=0) / 1000
    for v in (*wall_ns.values(), *cpu_ns.values()):
        v.sort()
    all_wall = sorted(ns for v in wall_ns.values() for ns in v)
    all_cpu = sorted(ns for v in cpu_ns.values() for ns in v)

    num_pending = len(router.index.pending)
    # Fallback: the index actor is gone; the routed history becomes the index, warming up
    # one replica per decision (those decide from the last events).
    t0 = time.perf_counter()
    router.set_fallback(True)
    fallback_activation_ms = (time.perf_counter() - t0) * 1000
    warmup_cpu: list[int] = []
    fallback_cpu: list[int] = []
    for i, (_, hashes) in enumerate(prompts[:2000]):
        sim_now[0] += 0.005
        warming = router.history.warming
        cpu_start = cpu()
        router.route(f"f{i}", hashes, PROMPT_BLOCKS * BLOCK_SIZE, replica_ids, 256)
        (warmup_cpu if warming else fallback_cpu).append(cpu() - cpu_start)
        router.on_finished(f"f{i}")
    fallback_cpu.sort()
    # (None: the warm-up took all 2,000 decisions, as at 256 replicas after 20,000 routed)
    fallback_p50, fallback_p99 = (
        (round(pct(fallback_cpu, .5), 1), round(pct(fallback_cpu, .99), 1)) if fallback_cpu
        else (None, None))
    history_blocks = router.history.num_blocks()

    print(f"router: {args.policy} (mark_whole_prompt {router.config.mark_whole_prompt}), "
          f"{args.replicas} replicas, {distinct:,} distinct blocks "
          f"indexed ({blocks['device']:,} on some device, {blocks['host']:,} on some host; "
          f"{holdings:,} replica holdings) from {num_events:,} events + {args.replicas} "
          f"snapshots: built in {build_s:.2f} s ({build_cpu_s:.2f} s of CPU), "
          f"{index_mib:.0f} MiB (tracemalloc), "
          f"{index_bytes / holdings:.1f} B per holding")
    print(f"load average {load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} CPUs; "
          "wall = perf_counter_ns, cpu = thread_time_ns")
    print(f"{'prompts (512 blocks)':<16}{'n':>6}{'wall p50':>10}{'p90':>9}{'p99':>9}{'max':>9}"
          f"{'cpu p50':>9}{'p99':>9}{'hit tok':>9}  (us)")

    def row(name: str, wall: list[int], cpus: list[int], hit: str) -> None:
        print(f"{name:<16}{len(wall):>6}{pct(wall, .5):>10.1f}{pct(wall, .9):>9.1f}"
              f"{pct(wall, .99):>9.1f}{wall[-1] / 1000:>9.1f}{pct(cpus, .5):>9.1f}"
              f"{pct(cpus, .99):>9.1f}{hit:>9}")

    for kind in KINDS:
        row(kind, wall_ns[kind], cpu_ns[kind], f"{hit_tokens[kind] / len(wall_ns[kind]):.0f}")
    row("all", all_wall, all_cpu, "")
    print(f"full GC collections during the loop: {len(gc_pauses_ns)}, longest {max_gc_us:.0f} us; "
          f"collections of any generation inside the timed decisions: "
          f"{len(gc_in_decisions_ns)}, {sum(gc_in_decisions_ns) / 1e6:.1f} ms of CPU in all, "
          f"longest {max(gc_in_decisions_ns, default=0) / 1000:.0f} us")
    print(f"fallback: set_fallback {fallback_activation_ms:.2f} ms; {len(warmup_cpu)} warm-up "
          f"decisions (replaying {history_blocks:,} blocks) cpu mean "
          f"{sum(warmup_cpu) / max(1, len(warmup_cpu)) / 1000:.1f} us, max "
          f"{max(warmup_cpu, default=0) / 1000:.1f} us; then {len(fallback_cpu)} decisions "
          f"cpu p50 {fallback_p50} us, p99 {fallback_p99} us")
    print(json.dumps({
        "policy": args.policy,
        "mark_whole_prompt": router.config.mark_whole_prompt,
        "replicas": args.replicas,
        "indexed_blocks": distinct,
        "indexed_blocks_device": blocks["device"],
        "indexed_blocks_host": blocks["host"],
        "replica_holdings": holdings,
        "decisions": len(all_wall),
        "decision_p50_us": round(pct(all_wall, .5), 1),
        "decision_p90_us": round(pct(all_wall, .9), 1),
        "decision_p99_us": round(pct(all_wall, .99), 1),
        "decision_max_us": round(all_wall[-1] / 1000, 1),
        "decision_cpu_p50_us": round(pct(all_cpu, .5), 1),
        "decision_cpu_p99_us": round(pct(all_cpu, .99), 1),
        "decision_cpu_max_us": round(all_cpu[-1] / 1000, 1),
        "full_gc_count": len(gc_pauses_ns),
        "full_gc_max_us": round(max_gc_us, 1),
        "gc_freeze": args.gc_freeze,
        "gc_in_decisions": len(gc_in_decisions_ns),
        "gc_in_decisions_cpu_ms": round(sum(gc_in_decisions_ns) / 1e6, 1),
        "gc_in_decisions_max_us": round(max(gc_in_decisions_ns, default=0) / 1000, 1),
        "p99_target_us": 1000,
        "build_s": round(build_s, 2),
        "build_cpu_s": round(build_cpu_s, 2),
        "index_mib": round(index_mib, 1),
        "index_bytes_per_holding": round(index_bytes / holdings, 1),
        "pending_marks_at_end": num_pending,
        "fallback_activation_ms": round(fallback_activation_ms, 2),
        "fallback_warmup_decisions": len(warmup_cpu),
        "fallback_warmup_decision_cpu_max_us": round(max(warmup_cpu, default=0) / 1000, 1),
        "fallback_decision_cpu_p50_us": fallback_p50,
        "fallback_decision_cpu_p99_us": fallback_p99,
        "load_average_1m": round(load_after, 2),
        "decisions_sha256": digest.hexdigest()[:16],
    }))


if __name__ == "__main__":
    main()
