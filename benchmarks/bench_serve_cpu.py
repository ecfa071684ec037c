"""Where a spaced request's CPU goes in `kvroute serve`: every process's CPU seconds.

    python benchmarks/bench_serve_cpu.py [--requests 300] [--serve-arg=--gateways --serve-arg=1]

Starts `kvroute serve --engine sim --sim-preset tiny --replicas 2` (on a Ray instance of its
own), sends 20 requests to warm it, reads every process's CPU time from /proc over 20 idle
seconds, then over N requests sent one after the other (max_tokens 1, a 32-word prompt each
new). Prints the processes that used CPU in each phase (Ray actors by their names), then one
JSON line: the latency p50/p90 of the requests, the CPU a request of the index actor, the
ingress routers, the engine replicas and Serve's proxy, and the 1-minute load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks.simlib import servers  # noqa: E402
from benchmarks.simlib.ray_head import RayHead  # noqa: E402

TICKS_S = os.sysconf("SC_CLK_TCK")
GROUPS = {"index_actor": "ray::KVIndex", "ingress_routers": "KVRouteIngressRouter",
          "engine_replicas": "EngineReplica", "serve_proxy": "ray::ProxyActor"}


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """Every process's command line (its start) and CPU seconds so far."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:90]
        except OSError:  # gone meanwhile
            continue
        out[int(pid)] = (cmd, (int(fields[11]) + int(fields[12])) / TICKS_S)
    return out


def used(before: dict, after: dict) -> list[tuple[float, int, str]]:
    rows = [(cpu - before.get(pid, (cmd, 0.0))[1], pid, cmd)
            for pid, (cmd, cpu) in after.items()]
    return sorted((r for r in rows if r[0] > 0.005), reverse=True)


def show(label: str, rows: list, wall_s: float) -> None:
    print(f"--- {label}: {wall_s:.1f} s wall, {sum(r[0] for r in rows):.2f} s CPU")
    for cpu, pid, cmd in rows[:14]:
        print(f"  {cpu:7.2f} s  {pid:7d}  {cmd}")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--idle-s", type=float, default=20.0)
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_serve_cpu-"))
    head = RayHead(work)
    env = {"RAY_SERVE_HAPROXY_STATS_PORT": str(servers.free_port()),
           "RAY_SERVE_HAPROXY_METRICS_PORT": str(servers.free_port())}
    server = servers.start(lambda: servers.kvroute_serve(
        ["--model", "tiny", "--engine", "sim", "--sim-preset", "tiny", *args.serve_arg],
        work / "serve.log", 2, env, head.address), after_failure=head.reset_serve)
    try:
        client = httpx.Client(base_url=server.base_url, timeout=30)
        body = {"model": "tiny", "prompt": "hello " * 30, "max_tokens": 1}
        for _ in range(20):
            client.post("/v1/completions", json=body).raise_for_status()
        before, start = cpu_by_process(), time.monotonic()
        time.sleep(args.idle_s)  # the idle phase is what is measured, not a wait for a state
        show("idle", used(before, cpu_by_process()), time.monotonic() - start)
        latencies = []
        before, start = cpu_by_process(), time.monotonic()
        for i in range(args.requests):
            body["prompt"] = f"request {i} " + "hello " * 30
            sent = time.perf_counter()
            client.post("/v1/completions", json=body).raise_for_status()
            latencies.append((time.perf_counter() - sent) * 1e3)
        rows = used(before, cpu_by_process())
        show(f"{args.requests} requests one after the other", rows, time.monotonic() - start)
    finally:
        server.stop()
        head.stop()
    per_request = {name: round(sum(cpu for cpu, _, cmd in rows if key in cmd)
                               / args.requests * 1e3, 2) for name, key in GROUPS.items()}
    out = {"requests": args.requests, "serve_args": args.serve_arg,
           "latency_p50_ms": round(statistics.median(latencies), 2),
           "latency_p90_ms": round(statistics.quantiles(latencies, n=10)[-1], 2),
           "cpu_ms_per_request": per_request, "load_average_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
