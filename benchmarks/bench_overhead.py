"""What `kvroute serve` adds over its engines: latency per request, cost per token.

    python benchmarks/bench_overhead.py [--floor] [--serve-env RAY_SERVE_...=1]

Serves the simulated engine (preset tiny, well under a millisecond a step) in one run, two
ways, one after the other on the same box:
  (a) standalone: N `kvroute engine` processes, the client round-robining over them itself
      (skipped, with its ratios null, while this checkout has no `kvroute engine`);
  (b) `kvroute serve --engine sim --sim-preset tiny --replicas N`.
With --floor it also serves a trivial Ray Serve app that does no work (1 and 2 hops,
benchmarks/simlib/serve_floor.py): the part of (b) that is Serve's own.

Each gets the same three phases (benchmarks/simlib/overhead_client.py): 1 request in flight
with max_tokens 1 (p50 ms), 32 in flight with max_tokens 1 (req/s), 64 streams in flight of
64 tokens each (tok/s). Prints a table, then one JSON line: serve_added_latency_p50_ms
(b - a), serve_req_s_ratio (b / a), serve_stream_tok_s_ratio (b / a), and every figure.
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

from benchmarks.simlib import servers  # noqa: E402
from benchmarks.simlib.overhead_client import ClientConfig, OverheadClient  # noqa: E402

SIM_ARGS = ["--engine", "sim", "--sim-preset", "tiny"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--idle-requests", type=int, default=300)
    p.add_argument("--burst-requests", type=int, default=1500)
    p.add_argument("--burst-concurrency", type=int, default=32)
    p.add_argument("--streams", type=int, default=320, help="streams sent in all")
    p.add_argument("--stream-concurrency", type=int, default=64)
    p.add_argument("--stream-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--serve-env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of `kvroute serve` (and of the floor app), repeatable")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="an extra `kvroute serve` argument, repeatable")
    p.add_argument("--no-standalone", action="store_true", help="skip (a)")
    p.add_argument("--no-serve", action="store_true", help="skip (b)")
    p.add_argument("--floor", action="store_true",
                   help="also measure the trivial Serve app, 1 and 2 hops")
    p.add_argument("--out", type=Path, default=None, help="write the JSON line here too")
    args = p.parse_args(argv)
    for pair in args.serve_env:
        if "=" not in pair:
            p.error(f"--serve-env wants NAME=VALUE, got {pair!r}")
    return args


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def measure(name: str, base_urls: list[str], args: argparse.Namespace) -> dict:
    client = OverheadClient(ClientConfig(tuple(base_urls), "tiny", args.prompt_tokens))

    async def phases() -> dict:
        await client.warm_up(8)
        load_before = load_average()
        idle = await client.idle_latency_s(args.idle_requests)
        req_s = await client.burst_req_s(args.burst_requests, args.burst_concurrency)
        tok_s = await client.stream_tok_s(args.streams, args.stream_concurrency,
                                          args.stream_tokens)
        return {"latency_p50_ms": round(float(np.percentile(idle, 50)) * 1e3, 2),
                "latency_p90_ms": round(float(np.percentile(idle, 90)) * 1e3, 2),
                "req_s": round(req_s, 1), "stream_tok_s": round(tok_s, 1),
                "load_avg_1m": [load_before, load_average()]}

    out = asyncio.run(phases())
    print(f"{name:<16}{out['latency_p50_ms']:>10.2f}{out['latency_p90_ms']:>10.2f}"
          f"{out['req_s']:>10.1f}{out['stream_tok_s']:>12.1f}   load {out['load_avg_1m']}",
          flush=True)
    return out


def run_standalone(args: argparse.Namespace, workdir: Path) -> dict:
    engines = []
    try:
        for i in range(args.replicas):
            engines.append(servers.start(
                lambda i=i: servers.kvroute_engine(SIM_ARGS, workdir / f"engine-{i}.log")))
        return measure("standalone", [e.base_url for e in engines], args)
    finally:
        for engine in engines:
            engine.stop()


def run_serve(args: argparse.Namespace, env: dict[str, str], workdir: Path) -> dict:
    server = servers.start(lambda: servers.kvroute_serve(
        SIM_ARGS + args.serve_arg, workdir / "serve.log", args.replicas, env))
    try:
        return measure("kvroute serve", [server.base_url], args)
    finally:
        server.stop()


def run_floor(num_hops: int, env: dict[str, str], args: argparse.Namespace,
              workdir: Path) -> dict:
    server = servers.start(
        lambda: servers.serve_floor(workdir / f"floor-{num_hops}.log", num_hops, env))
    try:
        return measure(f"serve floor {num_hops}hop", [server.base_url], args)
    finally:
        server.stop()


def ratios(standalone: dict | None, serve: dict | None) -> dict:
    if standalone is None or serve is None:
        return {"serve_added_latency_p50_ms": None, "serve_req_s_ratio": None,
                "serve_stream_tok_s_ratio": None}
    return {
        "serve_added_latency_p50_ms": round(serve["latency_p50_ms"]
                                            - standalone["latency_p50_ms"], 2),
        "serve_req_s_ratio": round(serve["req_s"] / standalone["req_s"], 3),
        "serve_stream_tok_s_ratio": round(serve["stream_tok_s"] / standalone["stream_tok_s"],
                                          3),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    env = dict(pair.split("=", 1) for pair in args.serve_env)
    results: dict[str, dict | None] = {"standalone": None, "serve": None}
    print(f"{'':<16}{'p50 ms':>10}{'p90 ms':>10}{'req/s':>10}{'stream tok/s':>12}   "
          f"(1 in flight; {args.burst_concurrency} in flight; {args.stream_concurrency} "
          f"streams x {args.stream_tokens} tokens)", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvroute-bench-overhead-") as tmp:
        workdir = Path(tmp)
        if not args.no_standalone:
            if servers.standalone_engine_available():
                results["standalone"] = run_standalone(args, workdir)
            else:
                print("standalone      skipped: this checkout has no `kvroute engine`",
                      flush=True)
        if not args.no_serve:
            results["serve"] = run_serve(args, env, workdir)
        if args.floor:
            results["floor_1hop"] = run_floor(1, env, args, workdir)
            results["floor_2hop"] = run_floor(2, env, args, workdir)
    out = {**ratios(results["standalone"], results["serve"]), "serve_env": env,
           "replicas": args.replicas, **results}
    line = json.dumps(out)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return out


if __name__ == "__main__":
    main()
