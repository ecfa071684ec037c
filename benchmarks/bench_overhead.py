"""What `kvroute serve` adds over its engines: latency per request, cost per token.

    python benchmarks/bench_overhead.py [--compare before:KVROUTE_INGRESS=gateway]

Serves the simulated engine (preset tiny, well under a millisecond a step) in one run, two
ways on the same box:
  (a) standalone: N `kvroute engine` processes, the client round-robining over them itself;
  (b) `kvroute serve --engine sim --sim-preset tiny --replicas N` (with its defaults, or the
      environment of --serve-env; each --compare NAME:K=V,... is another (b), in turn).
The standalone engines stay up for the whole run; each (b) is measured in rounds that
alternate with rounds on (a) (benchmarks/simlib/paired_rounds.py), so the box's load, which
other people's work sets here, falls on both alike. A round: 1 request in flight with
max_tokens 1 (latency), 32 in flight with max_tokens 1 (req/s), 64 streams in flight of 64
tokens each (tok/s). With --floor MODE it also measures a trivial Ray Serve app that does no
work (benchmarks/simlib/serve_floor.py; 1hop, 2hop, direct; throughput-optimized), paired
with (a) the same way: the part of (b) that is Serve's own.

Prints a table, then one JSON line: serve_added_latency_p50_ms (b - a), serve_req_s_ratio
(b / a), serve_stream_tok_s_ratio (b / a) for the main (b), and every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.simlib import servers  # noqa: E402
from benchmarks.simlib.paired_rounds import PhaseConfig, paired_rounds  # noqa: E402
from benchmarks.simlib.ray_head import RayHead  # noqa: E402

SIM_ARGS = ["--model", "tiny", "--engine", "sim", "--sim-preset", "tiny"]
FLOOR_MODES = ("1hop", "2hop", "direct")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="paired rounds per (b)")
    p.add_argument("--idle-requests", type=int, default=100, help="per round")
    p.add_argument("--burst-requests", type=int, default=500, help="per round")
    p.add_argument("--burst-concurrency", type=int, default=32)
    p.add_argument("--streams", type=int, default=128, help="per round")
    p.add_argument("--stream-concurrency", type=int, default=64)
    p.add_argument("--stream-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--serve-env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of the main `kvroute serve`, repeatable")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="an extra `kvroute serve` argument, repeatable")
    p.add_argument("--compare", action="append", default=[], metavar="NAME:K=V,K=V",
                   help="also measure `kvroute serve` with these extra env variables "
                        "(repeatable), e.g. before:RAY_SERVE_THROUGHPUT_OPTIMIZED=0")
    p.add_argument("--no-serve", action="store_true", help="skip the main (b)")
    p.add_argument("--floor", action="append", default=[], choices=FLOOR_MODES,
                   help="also measure the trivial Serve app this way (repeatable)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON line here too")
    args = p.parse_args(argv)
    for pair in args.serve_env:
        if "=" not in pair:
            p.error(f"--serve-env wants NAME=VALUE, got {pair!r}")
    if not servers.standalone_engine_available():
        p.error("this checkout has no `kvroute engine` (the standalone server of (a))")
    return args


def parse_env(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split(",") if pair)


def haproxy_side_ports() -> dict[str, str]:
    """HAProxy's stats and metrics listeners on free ports: a joined Ray instance would get
    Ray's fixed defaults, which another instance on this host may hold."""
    return {"RAY_SERVE_HAPROXY_STATS_PORT": str(servers.free_port()),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(servers.free_port())}


class Run:
    """The standalone engines and the shared Ray instance of one benchmark run."""

    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args, self.workdir = args, workdir
        self.phases = PhaseConfig(args.idle_requests, args.burst_requests,
                                  args.burst_concurrency, args.streams,
                                  args.stream_concurrency, args.stream_tokens,
                                  args.prompt_tokens)
        self.engines = [servers.start(lambda i=i: servers.kvroute_engine(
            SIM_ARGS, workdir / f"engine-{i}.log")) for i in range(args.replicas)]
        self.head = RayHead(workdir)
        self.results: dict[str, dict] = {}

    def measure_against_standalone(self, name: str, server: servers.ServerProcess) -> None:
        figures = paired_rounds({"standalone": [e.base_url for e in self.engines],
                                 name: [server.base_url]}, self.phases, self.args.rounds)
        for fig in figures.values():
            print(fig.line(), flush=True)
        standalone, served = figures["standalone"].summary(), figures[name].summary()
        self.results[name] = {**served, **ratios(standalone, served),
                              "paired_standalone": standalone}

    def serve(self, name: str, env: dict[str, str]) -> None:
        server = servers.start(lambda: servers.kvroute_serve(
            SIM_ARGS + self.args.serve_arg, self.workdir / f"serve-{name}.log",
            self.args.replicas, {**haproxy_side_ports(), **env}, self.head.address),
            after_failure=self.head.reset_serve)
        try:
            self.measure_against_standalone(name, server)
        finally:
            server.stop()
            self.head.reset_serve()

    def floor(self, mode: str) -> None:
        server = servers.start(lambda: servers.serve_floor(
            self.workdir / f"floor-{mode}.log", mode, {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
            self.head.address),
            after_failure=self.head.reset_serve)
        try:
            self.measure_against_standalone(f"floor {mode}", server)
        finally:
            server.stop()
            self.head.reset_serve()

    def stop(self) -> None:
        self.head.stop()
        for engine in self.engines:
            engine.stop()


def ratios(standalone: dict, served: dict) -> dict:
    return {"added_latency_p50_ms": round(served["latency_p50_ms"]
                                          - standalone["latency_p50_ms"], 2),
            "req_s_ratio": round(served["req_s"] / standalone["req_s"], 3),
            "stream_tok_s_ratio": round(served["stream_tok_s"] / standalone["stream_tok_s"],
                                        3)}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    env = dict(pair.split("=", 1) for pair in args.serve_env)
    print(f"{'':<18}{'p50 ms':>9}{'p90 ms':>9}{'req/s':>10}{'stream tok/s':>13}   "
          f"(1 in flight; {args.burst_concurrency} in flight; {args.stream_concurrency} "
          f"streams x {args.stream_tokens} tokens)", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvroute-bench-overhead-") as tmp:
        run = Run(args, Path(tmp))
        try:
            if not args.no_serve:
                run.serve("kvroute serve", env)
            for spec in args.compare:
                name, _, extra = spec.partition(":")
                run.serve(f"serve {name}", {**env, **parse_env(extra)})
            for mode in args.floor:
                run.floor(mode)
        finally:
            run.stop()
    main_result = run.results.get("kvroute serve", {})
    out = {"serve_added_latency_p50_ms": main_result.get("added_latency_p50_ms"),
           "serve_req_s_ratio": main_result.get("req_s_ratio"),
           "serve_stream_tok_s_ratio": main_result.get("stream_tok_s_ratio"),
           "serve_env": env, "replicas": args.replicas, **run.results}
    line = json.dumps(out)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return out


if __name__ == "__main__":
    main()
