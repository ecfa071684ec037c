"""What `kvroute serve` adds over its engines: latency per request, cost per token.

    python benchmarks/bench_overhead.py [--floor 1hop] [--serve-env RAY_SERVE_...=1]

Serves the simulated engine (preset tiny, well under a millisecond a step) in one run, two
ways, one after the other on the same box:
  (a) standalone: N `kvroute engine` processes, the client round-robining over them itself
      (skipped, with its ratios null, while this checkout has no `kvroute engine`);
  (b) `kvroute serve --engine sim --sim-preset tiny --replicas N`.
With --floor MODE it also serves a trivial Ray Serve app that does no work
(benchmarks/simlib/serve_floor.py; 1hop, 2hop, direct): the part of (b) that is Serve's own.

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
from benchmarks.simlib.ray_head import RayHead  # noqa: E402

SIM_ARGS = ["--engine", "sim", "--sim-preset", "tiny"]
FLOOR_MODES = ("1hop", "2hop", "direct")


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
    p.add_argument("--compare", action="append", default=[], metavar="NAME:K=V,K=V",
                   help="also measure `kvroute serve` with these extra env variables, "
                        "side by side (repeatable), e.g. before:RAY_SERVE_THROUGHPUT_"
                        "OPTIMIZED=0")
    p.add_argument("--ray-per-server", action="store_true",
                   help="let each server start its own local Ray instance (default: one "
                        "instance for the run, which each server joins in turn)")
    p.add_argument("--no-standalone", action="store_true", help="skip (a)")
    p.add_argument("--no-serve", action="store_true", help="skip (b)")
    p.add_argument("--floor", action="append", default=[], choices=FLOOR_MODES,
                   help="also measure the trivial Serve app this way (repeatable): 1hop, "
                        "2hop (ingress + a streaming handle), direct (HAProxy + an ingress "
                        "request router + ingress replicas answering HTTP)")
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


def run_serve(name: str, args: argparse.Namespace, env: dict[str, str], workdir: Path,
              head: RayHead | None) -> dict:
    address = head.address if head is not None else None
    # HAProxy's side listeners (stats, metrics) on free ports: a joined cluster would get
    # Ray's fixed defaults, which another instance on this host may hold
    env = {"RAY_SERVE_HAPROXY_STATS_PORT": str(servers.free_port()),
           "RAY_SERVE_HAPROXY_METRICS_PORT": str(servers.free_port()), **env}
    server = servers.start(lambda: servers.kvroute_serve(
        SIM_ARGS + args.serve_arg, workdir / f"serve-{name}.log", args.replicas, env,
        address), after_failure=head.reset_serve if head is not None else None)
    try:
        return measure(name, [server.base_url], args)
    finally:
        server.stop()
        if head is not None:
            head.reset_serve()


def run_floor(mode: str, env: dict[str, str], args: argparse.Namespace, workdir: Path,
              head: RayHead | None) -> dict:
    address = head.address if head is not None else None
    server = servers.start(lambda: servers.serve_floor(
        workdir / f"floor-{mode}.log", mode, env, address),
        after_failure=head.reset_serve if head is not None else None)
    try:
        return measure(f"floor {mode}", [server.base_url], args)
    finally:
        server.stop()
        if head is not None:
            head.reset_serve()


def parse_env(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split(",") if pair)


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
        head = None if args.ray_per_server else RayHead(workdir)
        try:
            if not args.no_serve:
                results["serve"] = run_serve("kvroute serve", args, env, workdir, head)
            for spec in args.compare:
                name, _, extra = spec.partition(":")
                results[f"serve_{name}"] = run_serve(f"serve {name}", args,
                                                     {**env, **parse_env(extra)}, workdir,
                                                     head)
            for mode in args.floor:
                results[f"floor_{mode}"] = run_floor(mode, env, args, workdir, head)
        finally:
            if head is not None:
                head.stop()
    out = {**ratios(results["standalone"], results["serve"]), "serve_env": env,
           "replicas": args.replicas, **results}
    line = json.dumps(out)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return out


if __name__ == "__main__":
    main()
