"""Where `kvroute serve`'s time goes per request and per token: py-spy on its processes.

    python benchmarks/profile_overhead.py --phase streams [--serve-env NAME=VALUE]

Starts `kvroute serve --engine sim --sim-preset tiny --replicas 2` (on a local Ray instance
of its own, benchmarks/simlib/ray_head.py), drives one phase of bench_overhead.py's client
at it (idle: 1 request in flight, max_tokens 1; burst: 32 in flight; streams: 64 streams of
64 tokens) and records with `py-spy record` while it runs: the Serve proxy, the gateway
(ingress gateway) or the ingress request router (ingress direct, --serve-env
KVROUTE_INGRESS=direct), and one engine replica.
Prints, per process, the share of the run its Python code held the GIL (the CPU its
interpreter used; time in C without the GIL, e.g. in Ray's core worker, is not counted),
that time split by where the code lives (leaf frame: Serve proxy, Serve replica, Ray
core, HTTP server, ASGI, asyncio, kvroute, ...) and the heaviest functions, and writes the
raw stacks (flamegraph-ready collapsed format) to --out-dir.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.simlib import servers  # noqa: E402
from benchmarks.simlib.overhead_client import ClientConfig, OverheadClient  # noqa: E402
from benchmarks.simlib.ray_head import RayHead  # noqa: E402
from benchmarks.simlib.stack_buckets import bucket_of, frame_file  # noqa: E402

PY_SPY = str(ROOT / ".venv" / "bin" / "py-spy")
ROLES = {"proxy": "ProxyActor", "gateway": "kvroute:Gateway",
         "router": "kvroute:KVRouteIngressRouter", "engine": "kvroute:EngineReplica"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phase", choices=("idle", "burst", "streams"), default="streams")
    p.add_argument("--duration-s", type=float, default=15.0)
    p.add_argument("--rate", type=int, default=50, help="py-spy samples per second")
    p.add_argument("--serve-env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--top", type=int, default=12, help="functions listed per process")
    p.add_argument("--out-dir", type=Path, default=None)
    return p.parse_args(argv)


def find_pids(session_id: int) -> dict[str, int]:
    """The first process of each role in the server's session (Ray's workers inherit it)."""
    found: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) != session_id:
                continue
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ProcessLookupError):
            continue
        for role, marker in ROLES.items():
            if role not in found and marker.encode() in cmdline:
                found[role] = int(entry)
    return found


async def drive(client: OverheadClient, phase: str, until_s: float) -> int:
    """Runs the phase in rounds until the deadline; returns the rounds run."""
    rounds = 0
    while time.monotonic() < until_s:
        if phase == "idle":
            await client.idle_latency_s(50)
        elif phase == "burst":
            await client.burst_req_s(256, 32)
        else:
            await client.stream_tok_s(64, 64, 64)
        rounds += 1
    return rounds


def summarize(role: str, raw_path: Path, duration_s: float, rate: int, top: int) -> None:
    self_counts: collections.Counter[str] = collections.Counter()
    buckets: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw_path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        leaf = stack.rsplit(";", 1)[-1]
        total += count
        self_counts[leaf] += count
        buckets[bucket_of(stack)] += count
    expected = duration_s * rate
    print(f"\n{role}: Python held the GIL {100 * total / expected:.0f}% of the run "
          f"({total} samples at {rate}/s over {duration_s:.0f} s)")
    for name, count in buckets.most_common():
        print(f"  {100 * count / max(total, 1):5.1f}%  {name}")
    print("  heaviest functions (self):")
    for leaf, count in self_counts.most_common(top):
        print(f"  {100 * count / max(total, 1):5.1f}%  {frame_file(leaf)}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    env = dict(pair.split("=", 1) for pair in args.serve_env)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="kvroute-profile-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    head = RayHead(out_dir)
    env = {"RAY_SERVE_HAPROXY_STATS_PORT": str(servers.free_port()),
           "RAY_SERVE_HAPROXY_METRICS_PORT": str(servers.free_port()), **env}
    server = servers.start(lambda: servers.kvroute_serve(
        ["--model", "tiny", "--engine", "sim", "--sim-preset", "tiny", *args.serve_arg],
        out_dir / "serve.log", 2, env, head.address), after_failure=head.reset_serve)
    try:
        client = OverheadClient(ClientConfig((server.base_url,), "tiny"))
        asyncio.run(client.warm_up(8))
        pids = find_pids(os.getsid(head.pid))
        print(f"profiling {pids} during phase {args.phase!r}, load {os.getloadavg()[0]:.2f}",
              flush=True)
        spies = {role: subprocess.Popen(
            [PY_SPY, "record", "-p", str(pid), "-f", "raw", "-r", str(args.rate), "--gil",
             "-d", str(int(args.duration_s)), "-o", str(out_dir / f"{role}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for role, pid in pids.items()}
        rounds = asyncio.run(drive(client, args.phase,
                                   time.monotonic() + args.duration_s + 1.0))
        for spy in spies.values():
            spy.wait(timeout=120)
        print(f"{rounds} rounds of {args.phase}; load {os.getloadavg()[0]:.2f}; raw stacks "
              f"in {out_dir}")
    finally:
        server.stop()
        head.stop()
    for role in spies:
        summarize(role, out_dir / f"{role}.txt", args.duration_s, args.rate, args.top)


if __name__ == "__main__":
    main()
