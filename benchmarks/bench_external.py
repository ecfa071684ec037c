"""kvroute in front of external OpenAI-compatible workers, over HTTP, in one run.

    python benchmarks/bench_external.py [--results]

Starts 4 `kvroute engine --engine sim` workers (simulated H100 + Llama 3 8B step times,
batching as vLLM does on an H100: 8,192 tokens and 1,024 requests a step; their KV events in
vLLM's format on ZMQ) and sends SGLang's generated-shared-prefix workload,
scaled down (16 groups x 8 prompts, a 1,024-token system prompt per group, a 64-token
question, 32 output tokens, shuffled, all sent at once as SGLang's bench_serving does),
through:
  - direct: the client round-robins over the workers itself (no kvroute);
  - events: `kvroute serve --workers` routing on the workers' KV events (cache_aware);
  - approximate: the same, on its own routed history (--approximate);
  - round_robin: the same gateway, --policy round_robin.
Each run gets its own prompts (its own seed), so no run hits what an earlier one cached,
and a few requests first (other prompts). The four runs are repeated (--rounds, 2), every
other round in reverse order, and averaged.
The bound is one LRU with the 4 workers' blocks serving the same prompts in the same order
(benchmarks/simlib/pooled.py). Then, beside the events gateway, the latency of one request
alone (max_tokens 1) through kvroute and straight to a worker, taking turns; and beside the
round_robin gateway, streamed tokens per second with 64 streams in flight through kvroute
and straight to the workers, each measured twice, alternating.

Prints a table, then one JSON line: hit_rate_over_bound (events), ttft_p50_ratio_vs_round_robin
(events over kvroute round_robin), added_latency_p50_ms (kvroute minus direct),
stream_tok_s_ratio_vs_direct (kvroute round_robin over direct round robin). `--results`
also saves the run to benchmarks/results/bench_external.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.simlib import workloads as wl  # noqa: E402
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim  # noqa: E402
from benchmarks.simlib.engine_workers import EngineWorker, stop_all  # noqa: E402
from benchmarks.simlib.gateway_server import start_gateway, stop_gateway  # noqa: E402
from benchmarks.simlib.openai_load import LoadConfig, LoadGenerator, summarize_http  # noqa
from benchmarks.simlib.overhead_probe import (  # noqa: E402
    client_for,
    latency_p50_ms,
    stream_tok_s,
)
from benchmarks.simlib.pooled import PooledLRU  # noqa: E402
from benchmarks.simlib.prompts import TokenSource  # noqa: E402
from benchmarks.simlib.ray_head import RayHead  # noqa: E402
from benchmarks.simlib.replica import ReplicaConfig  # noqa: E402
from benchmarks.simlib.report import summarize  # noqa: E402
from benchmarks.simlib.results import save_result  # noqa: E402
from kv.hashing import DEFAULT_BLOCK_SIZE, block_hashes, namespace_root  # noqa: E402
from router.core.config import RouterConfig  # noqa: E402

MODEL = "tiny"
# name -> (kvroute serve flags, workers given with their KV event sockets)
GATEWAYS = {"events": ([], True), "approximate": (["--approximate"], False),
            "round_robin": (["--policy", "round_robin"], False)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--sim-preset", default="h100-llama3-8b")
    p.add_argument("--num-blocks", type=int, default=2048, help="KV blocks per worker")
    # The workers simulate an H100: they batch as vLLM does on one (its OpenAI server's
    # defaults for GPUs of 70 GiB and more, A100 aside; sim_routing.py's replicas too).
    p.add_argument("--max-num-batched-tokens", type=int, default=8192,
                   help="tokens per engine step")
    p.add_argument("--max-num-seqs", type=int, default=1024, help="requests per engine step")
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--prompts-per-group", type=int, default=8)
    p.add_argument("--system-len", type=int, default=1024)
    p.add_argument("--question-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight (default: all at once)")
    p.add_argument("--latency-requests", type=int, default=300)
    p.add_argument("--streams", type=int, default=320, help="streams per measurement")
    p.add_argument("--stream-concurrency", type=int, default=64)
    p.add_argument("--stream-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2,
                   help="times each run is repeated (every other round in reverse order)")
    p.add_argument("--results", action="store_true",
                   help="also save the run to benchmarks/results/bench_external.txt")
    return p.parse_args(argv)


def run_workload(args, base_url: str | None, worker_urls: list[str], seed: int) -> dict:
    """The workload through `base_url` (None: straight to the workers, round robin)."""
    workload = wl.generated_shared_prefix(args.groups, args.prompts_per_group, args.system_len,
                                          args.question_len, args.output_len, seed=seed)
    tokens = TokenSource(seed, 32, 127, workload.shared_keys())
    config = LoadConfig(base_url or "http://workers", MODEL,
                        max_concurrency=args.max_concurrency)
    records = asyncio.run(LoadGenerator(config, workload, tokens,
                                        None if base_url else worker_urls).run())
    summary = summarize_http(records)
    if summary["num_errors"]:
        raise RuntimeError(f"{summary['num_errors']} requests failed, first: "
                           f"{summary['first_error']}")
    bound = PooledLRU(args.workers * args.num_blocks, DEFAULT_BLOCK_SIZE)
    root = namespace_root(MODEL)
    for item in workload.items:
        ids = np.concatenate([tokens.tokens(s) for s in item.segments]).tolist()
        bound.serve_prompt(block_hashes(ids, DEFAULT_BLOCK_SIZE, root), len(ids))
    summary["bound_hit_rate"] = bound.hit_rate
    summary["load_avg_1m"] = os.getloadavg()[0]
    return summary


def measure_latency(args, base_url: str, worker_urls: list[str]) -> dict[str, float]:
    async def run() -> dict[str, float]:
        clients = {"kvroute": client_for(base_url, worker_urls),
                   "direct": client_for(None, worker_urls)}
        try:
            return await latency_p50_ms(clients, MODEL, args.latency_requests, 32)
        finally:
            for client in clients.values():
                await client.aclose()
    return {**asyncio.run(run()), "load_avg_1m": os.getloadavg()[0]}


def measure_streams(args, base_url: str, worker_urls: list[str]) -> dict[str, float]:
    async def one(url: str | None) -> float:
        async with client_for(url, worker_urls) as client:
            return await stream_tok_s(client, MODEL, args.streams, args.stream_concurrency,
                                      args.stream_tokens, 32)
    out: dict[str, list[float]] = {"direct": [], "kvroute": []}
    for _ in range(2):
        out["direct"].append(asyncio.run(one(None)))
        out["kvroute"].append(asyncio.run(one(base_url)))
    return {**{k: float(np.mean(v)) for k, v in out.items()},
            "load_avg_1m": os.getloadavg()[0]}


def warm_up(args, base_url: str | None, worker_urls: list[str]) -> None:
    """A few requests of the workload's shape first (connections, code paths), with
    prompts no timed run sends."""
    small = argparse.Namespace(**{**vars(args), "groups": 2, "prompts_per_group": 4})
    run_workload(small, base_url, worker_urls, seed=10_000)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    worker_args = ["--engine", "sim", "--sim-preset", args.sim_preset,
                   "--num-blocks", str(args.num_blocks), "--kv-events-port", "0"]
    worker_args += ["--max-num-batched-tokens", str(args.max_num_batched_tokens),
                    "--max-num-seqs", str(args.max_num_seqs)]
    workers = [EngineWorker(worker_args) for _ in range(args.workers)]
    runs: dict[str, list[dict]] = {name: [] for name in ("direct", *GATEWAYS)}
    latency: list[dict] = []
    streams: list[dict] = []
    head = None
    try:
        for worker in workers:  # they start together; on a crowded box that takes minutes
            worker.wait_ready(timeout_s=900.0)
        urls = [w.url for w in workers]
        with_events = [f"{w.url}#kv_events={w.kv_events_endpoint}"
                       f"&kv_replay={w.kv_events_replay_endpoint}" for w in workers]
        seeds = iter(range(1, 1000))  # every run its own prompts
        with tempfile.TemporaryDirectory(prefix="kvroute-bench-external-") as tmp:
            # one local Ray instance that each gateway joins in turn (a start per gateway
            # multiplies a crowded box's startup failures)
            head = RayHead(Path(tmp))
            for round_index in range(args.rounds):
                # every other round backwards, so a drift of the box's load hits all alike
                order = list(runs) if round_index % 2 == 0 else list(runs)[::-1]
                for name in order:
                    if name == "direct":
                        warm_up(args, None, urls)
                        runs[name].append(run_workload(args, None, urls, next(seeds)))
                        continue
                    flags, events = GATEWAYS[name]
                    # routed history assumes each worker caches what its pool holds
                    flags = [*flags, "--num-blocks", str(args.num_blocks)]
                    server = start_gateway(with_events if events else urls, flags,
                                           Path(tmp) / f"serve-{name}.log", events=events,
                                           head=head)
                    try:
                        warm_up(args, server.base_url, urls)
                        runs[name].append(run_workload(args, server.base_url, urls,
                                                       next(seeds)))
                        if name == "events":
                            latency.append(measure_latency(args, server.base_url, urls))
                        if name == "round_robin":
                            streams.append(measure_streams(args, server.base_url, urls))
                    finally:
                        stop_gateway(server, head)
            head.stop()
            head = None
    finally:
        if head is not None:
            head.stop()
        stop_all(workers)
    return report(args, runs, latency, streams)


def modelled_ttft_p50_s(args, policy: str, seed: int) -> float:
    """The same workload on the simulator's virtual clock (benchmarks/sim_routing.py's
    cluster: the same scheduler, KV manager, router and step-time model, no HTTP, no CPU
    contention): the TTFT the routing alone gives, with every request arriving at once."""
    workload = wl.generated_shared_prefix(args.groups, args.prompts_per_group, args.system_len,
                                          args.question_len, args.output_len, seed=seed)
    replica = ReplicaConfig(num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
                            max_num_batched_tokens=args.max_num_batched_tokens,
                            preset=args.sim_preset)
    run = ClusterSim(ClusterConfig(args.workers, replica, RouterConfig(policy=policy)),
                     workload).run()
    return summarize(run, policy, 0.0, 0.0, 0.0).ttft_p50_s


def _mean(rows: list[dict], key: str) -> float:
    return float(np.mean([r[key] for r in rows]))


def report(args, runs: dict[str, list[dict]], latency: list[dict], streams: list[dict]
           ) -> dict:
    lines = [f"{'run':<16}{'ok':>5}{'hit rate':>10}{'bound':>8}{'hit/bound':>11}"
             f"{'ttft p50 s':>12}{'ttft p90 s':>12}{'out tok/s':>11}{'load 1m':>9}"]
    for name, rows in runs.items():
        for i, s in enumerate(rows):
            lines.append(f"{name + f' #{i + 1}':<16}{s['num_ok']:>5}"
                         f"{s['cached_token_rate']:>10.3f}{s['bound_hit_rate']:>8.3f}"
                         f"{s['cached_token_rate'] / s['bound_hit_rate']:>11.3f}"
                         f"{s['ttft_p50_s']:>12.3f}{s['ttft_p90_s']:>12.3f}"
                         f"{s['throughput_tok_s']:>11.1f}{s['load_avg_1m']:>9.2f}")
    for i, (lat, st) in enumerate(zip(latency, streams)):
        lines.append(f"#{i + 1} one request alone, max_tokens 1, p50 ms: kvroute "
                     f"{lat['kvroute']:.2f}, direct {lat['direct']:.2f} (load 1m "
                     f"{lat['load_avg_1m']:.2f}); {args.stream_concurrency} streams in "
                     f"flight, tok/s: kvroute round_robin {st['kvroute']:.0f}, direct round "
                     f"robin {st['direct']:.0f} (load 1m {st['load_avg_1m']:.2f})")

    def hit_over_bound(name: str) -> float:
        rows = runs[name]
        return round(_mean(rows, "cached_token_rate") / _mean(rows, "bound_hit_rate"), 3)

    def ttft_ratio(name: str) -> float:
        return round(_mean(runs[name], "ttft_p50_s") / _mean(runs["round_robin"],
                                                              "ttft_p50_s"), 3)

    out = {
        "hit_rate_over_bound": hit_over_bound("events"),
        "ttft_p50_ratio_vs_round_robin": ttft_ratio("events"),
        "added_latency_p50_ms": round(_mean(latency, "kvroute") - _mean(latency, "direct"), 2),
        "stream_tok_s_ratio_vs_direct": round(_mean(streams, "kvroute")
                                              / _mean(streams, "direct"), 3),
        "approximate_hit_rate_over_bound": hit_over_bound("approximate"),
        "approximate_ttft_p50_ratio_vs_round_robin": ttft_ratio("approximate"),
        "direct_round_robin_ttft_p50_ratio_vs_round_robin": ttft_ratio("direct"),
    }
    modelled = {p: float(np.mean([modelled_ttft_p50_s(args, p, seed) for seed in (1, 2)]))
                for p in ("cache_aware", "round_robin")}
    lines.append(f"simulated (virtual clock, same workload and engines, no HTTP): ttft p50 "
                 f"cache_aware {modelled['cache_aware']:.3f} s, round_robin "
                 f"{modelled['round_robin']:.3f} s")
    out["simulated_ttft_p50_ratio_vs_round_robin"] = round(
        modelled["cache_aware"] / modelled["round_robin"], 3)
    print("\n".join(lines))
    if args.results:
        save_result("bench_external", results_text(args, lines, out))
    print(json.dumps(out))
    return out


def results_text(args, lines: list[str], out: dict) -> str:
    return (f"{args.workers} `kvroute engine --engine sim --sim-preset {args.sim_preset}` "
            f"workers, {args.num_blocks} KV blocks each, {args.max_num_batched_tokens} tokens "
            f"and {args.max_num_seqs} requests a step; {args.groups} groups x "
            f"{args.prompts_per_group} prompts, {args.system_len}-token system prompt, "
            f"{args.question_len}-token question, {args.output_len} output tokens, "
            f"{args.max_concurrency or 'all'} in flight\n"
            + "\n".join(lines) + "\n" + json.dumps(out))


if __name__ == "__main__":
    main()
