"""kvroute against the peer routers, in front of the same fresh workers, in one run.

    python benchmarks/bench_peers.py [--workload gsp ...] [--router kvroute_events ...]

Workers: --workers (4) `kvroute engine --engine sim` processes, their KV events on ZMQ in
vLLM's wire format, started fresh for every run (no run inherits another's cache).
Routers (benchmarks/peers/routers.py): none (the client round-robins), kvroute on the
events, kvroute approximate, sglang-router cache_aware, vllm-router cache_aware and
vllm-router kv_aware (on the same events), and kvroute's and vllm-router's fronts with
round robin (what a front adds to TTFT); the peers from PyPI, in a venv of their own.
Traffic: each workload (benchmarks/peers/workloads.py) through each router, the same
requests, sent as text (each token id one character) so that text-keyed and token-keyed
routers see the same prompts; multi-turn rounds resend the history with the answer's text.
Measured per run: hit rate (`usage.prompt_tokens_details.cached_tokens` over prompt
tokens), the pooled bound over the prompts as sent (benchmarks/peers/measure.py), load
share (busiest worker's computed tokens over the mean, from the workers' counters), TTFT
p50/p90. --rounds (2) rounds, every other one in reverse router order; each run (workers,
router, traffic) holds the heavy lock (--lock) and releases it after.

Prints a table, then one JSON line: worst_margin_vs_best_peer (kvroute-with-events'
hit/bound minus the best peer's, min over workloads), max_load_share (kvroute with events),
worst_events_minus_approximate, worst_ttft_p90_over_best_peer (median over rounds, max
over workloads) and sim_vs_live_abs_err_max (benchmarks/sim_vs_live.py on the same runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.peers import measure  # noqa: E402
from benchmarks.peers.event_recorder import (  # noqa: E402
    EventRecorder,
    live_miss_classes,
    serving_workers,
)
from benchmarks.peers.routers import (  # noqa: E402
    KVROUTE,
    MODEL,
    PEER_PROCESSES,
    ROUTERS,
    ensure_peers,
    start_router,
)
from benchmarks.peers.workloads import (  # noqa: E402
    WORKLOADS,
    PeerWorkload,
    add_workload_flags,
    peer_workload,
)
from benchmarks.simlib.engine_workers import EngineWorker, stop_all  # noqa: E402
from benchmarks.simlib.openai_load import LoadConfig, LoadGenerator, summarize_http  # noqa
from benchmarks.simlib.prompts import TokenSource  # noqa: E402
from benchmarks.simlib.ray_head import RayHead  # noqa: E402
from kv.hashing import DEFAULT_BLOCK_SIZE  # noqa: E402
from router.core.config import RouterConfig  # noqa: E402

MAX_BATCHED_TOKENS, MAX_SEQS = 8192, 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", action="append", choices=WORKLOADS,
                   help="run this workload (repeat; default: all)")
    p.add_argument("--router", action="append", choices=ROUTERS,
                   help="run this router (repeat; default: all)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--sim-preset", default="h100-llama3-8b")
    p.add_argument("--gateways", type=int, default=1,
                   help="kvroute serve's gateway processes (each routes on its own)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--round-offset", type=int, default=0,
                   help="number the rounds from this one (a later invocation's rounds: "
                        "seeds and the order's alternation go on)")
    p.add_argument("--results", type=Path, help="also write the table and JSON line here")
    p.add_argument("--report-from", type=Path, nargs="+",
                   help="run nothing: report the runs saved in these --raw-dir folders")
    p.add_argument("--lock", default="/tmp/kvroute-heavy.lock",
                   help="held during each run ('' for none)")
    p.add_argument("--lock-scope", choices=("run", "workload"), default="run",
                   help="hold the lock per run, or per workload's runs of one round (on a "
                        "box where others queue for it, a run may wait minutes for its turn)")
    p.add_argument("--raw-dir", type=Path, default=ROOT / ".cache" / "bench_peers",
                   help="each run's requests (prompts, timings) for sim_vs_live.py")
    p.add_argument("--no-sim", action="store_true", help="skip the simulator's prediction")
    p.add_argument("--record-events", action="store_true",
                   help="follow the workers' KV events from the client too, and classify "
                        "each run's misses (benchmarks/peers/event_recorder.py)")
    p.add_argument("--continuation-affinity", action=argparse.BooleanOptionalAction,
                   default=RouterConfig().continuation_affinity,
                   help="kvroute's routers: a conversation's next turn goes where its last "
                        "went (RouterConfig.continuation_affinity; default: kvroute's)")
    add_workload_flags(p)
    return p.parse_args(argv)


@contextlib.contextmanager
def heavy_lock(path: str):
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def warm_up(base_url: str | None, urls: list[str]) -> None:
    """A few short requests (connections, code paths) with prompts no workload sends."""
    from benchmarks.simlib import workloads as wl
    items = tuple(wl.WorkItem(f"warm-{i}", 0.0, (wl.Segment(f"warm/{i}", 48),), 2)
                  for i in range(8))
    workload = wl.Workload("warm", items)
    config = LoadConfig(base_url or "http://workers", MODEL, prompt_format="text")
    asyncio.run(LoadGenerator(config, workload, TokenSource(99, 32, 127),
                              None if base_url else urls).run())


def run_cell(args, spec: PeerWorkload, router: str, seed: int, log_dir: Path,
             head: RayHead | None) -> tuple[dict, list]:
    # the workers batch as vLLM does on an H100 (its defaults there), as in bench_external
    worker_args = ["--engine", "sim", "--sim-preset", args.sim_preset, "--num-blocks",
                   str(spec.num_blocks), "--kv-events-port", "0",
                   "--max-num-batched-tokens", str(MAX_BATCHED_TOKENS),
                   "--max-num-seqs", str(MAX_SEQS),
                   # the sim engine has no position limit: a prompt may fill the pool
                   "--max-model-len", str(spec.num_blocks * DEFAULT_BLOCK_SIZE)]
    workload = spec.build(seed)
    tokens = TokenSource(seed, 32, 127, workload.shared_keys())
    t0 = time.monotonic()
    workers: list[EngineWorker] = []
    running = recorder = None
    try:
        # started one by one inside the try: a SIGTERM while the later ones start still
        # stops the earlier ones
        for _ in range(args.workers):
            workers.append(EngineWorker(worker_args))
        for w in workers:
            w.wait_ready(timeout_s=300)
        urls = [w.url for w in workers]
        if args.record_events:
            recorder = EventRecorder([w.kv_events_endpoint for w in workers], MODEL)
        running = start_router(router, workers, spec.num_blocks, log_dir, head,
                               args.gateways, args.continuation_affinity)
        startup_s = time.monotonic() - t0
        warm_up(running.base_url, urls)
        before = [measure.worker_counters(u) for u in urls]
        config = LoadConfig(running.base_url or "http://workers", MODEL, prompt_format="text",
                            max_concurrency=spec.max_concurrency)
        load0 = os.getloadavg()[0]
        gen = LoadGenerator(config, workload, tokens, None if running.base_url else urls)
        records = asyncio.run(gen.run())
        after = [measure.worker_counters(u) for u in urls]
    finally:
        if recorder is not None:
            recorder.close()
        if running is not None:
            running.stop()
        stop_all(workers)
    summary = summarize_http(records)
    if summary["num_errors"]:
        raise RuntimeError(f"{router} on {spec.name}: {summary['num_errors']} requests failed, "
                           f"first: {summary['first_error']}")
    summary.pop("first_error")
    summary.update(measure.load_shares(before, after))
    if recorder is not None:
        summary["live_miss_classes"] = live_miss_classes(records, recorder.log, gen.t0, MODEL,
                                                         args.workers)
        # where each request ran (for placement comparisons, benchmarks/peers/placements.py)
        summary["serving_workers"] = serving_workers(records, recorder.log, gen.t0, MODEL)
    summary["bound_hit_rate"] = measure.pooled_bound(records, args.workers * spec.num_blocks,
                                                     MODEL)
    summary.update(workload=spec.name, router=router, seed=seed, num_workers=args.workers,
                   num_blocks=spec.num_blocks, sim_preset=args.sim_preset,
                   num_gateways=args.gateways,
                   continuation_affinity=args.continuation_affinity,
                   max_num_batched_tokens=MAX_BATCHED_TOKENS, max_num_seqs=MAX_SEQS,
                   startup_s=startup_s,
                   wall_s=time.monotonic() - t0, load_1m_start=load0,
                   load_1m_end=os.getloadavg()[0])
    return summary, records


def save_raw(args, summary: dict, records: list, stamp: str) -> None:
    out = args.raw_dir / stamp
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{summary['workload']}-{summary['router']}-s{summary['seed']}.jsonl"
    summary["raw"] = str(path)
    workers = summary.pop("serving_workers", {})  # on each request's line, not the summary's
    with open(path, "w") as f:
        f.write(json.dumps(summary) + "\n")
        for r in records:
            line = r.__dict__ | ({"worker": workers.get(r.request_id)} if workers else {})
            f.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> dict:
    # a SIGTERM unwinds (the finally blocks stop the workers, the router and Ray)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parse_args(argv)
    from benchmarks.peers.report import report
    if args.report_from:
        runs = [json.loads(path.open().readline()) for d in args.report_from
                for path in sorted(d.glob("*.jsonl"))]
        return report(args, runs, {}, 0.0)
    workloads = args.workload or list(WORKLOADS)
    routers = args.router or list(ROUTERS)
    versions = ensure_peers() if set(routers) & set(PEER_PROCESSES) else {}
    stamp = time.strftime("%Y%m%dT%H%M%S")
    runs: list[dict] = []
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvroute-bench-peers-") as tmp:
        head = RayHead(Path(tmp)) if set(routers) & set(KVROUTE) else None
        try:
            for round_index in range(args.round_offset, args.round_offset + args.rounds):
                order = routers if round_index % 2 == 0 else routers[::-1]
                for wname in workloads:
                    spec = peer_workload(wname, args)
                    per_workload = args.lock_scope == "workload"
                    with heavy_lock(args.lock if per_workload else ""):
                        for router in order:
                            try:
                                with heavy_lock("" if per_workload else args.lock):
                                    summary, records = run_cell(args, spec, router,
                                                                round_index + 1, Path(tmp), head)
                            except RuntimeError as err:  # the other runs still count
                                print(f"{wname} {router} round {round_index + 1} failed: "
                                      f"{str(err)[-1500:]}", flush=True)
                                continue
                            save_raw(args, summary, records, stamp)
                            runs.append(summary)
                            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                                              for k, v in summary.items()}), flush=True)
        finally:
            if head is not None:
                head.stop()
    return report(args, runs, versions, time.monotonic() - t_start)


if __name__ == "__main__":
    main()
