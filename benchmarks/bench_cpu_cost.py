"""CPU time per request and per token: the standalone engines beside `kvroute serve`.

    python benchmarks/bench_cpu_cost.py [--serve-env KVROUTE_INGRESS=gateway]

bench_overhead.py compares throughput; on a box with 2 cores, where the client, the engines,
HAProxy, the router and Ray's own processes all share the CPUs, throughput is set by the CPU
time each request costs in total. This measures that time: it serves the simulated engine
(preset tiny) two ways, as bench_overhead.py does ((a) 2 `kvroute engine` processes, the
client round-robining over them; (b) `kvroute serve --replicas 2` on a local Ray instance),
drives the same phase through each in turn, and reads the CPU time (user + system, from
/proc) of every process of each server's sessions and of the client before and after.
Processes are grouped by role (engine, ingress router, gateway, HAProxy, Serve proxy,
Ray's own). The ratio of the totals is the throughput ratio the CPU allows when the box is
the bottleneck: (a)'s CPU per request over (b)'s.

With --floor it also measures (c) the trivial Ray Serve app of benchmarks/simlib/serve_floor.py
behind the same ingress (HAProxy and an ingress request router that picks any replica, 2
replicas that answer without any work): what Ray Serve's direct ingress costs whatever the
app does. Everything of (c) but its app replicas (HAProxy, the router, Serve's proxy, Ray's
own processes) is CPU that any Serve app on this ingress adds to (a); `floor_bound_*` is
(a)'s total over (a)'s total plus that: the best ratio any Serve app could reach here when
the box is CPU-bound, before kvroute does anything, with its replicas and client as cheap as
(a)'s.

The served side's index actor is counted (benchmarks/simlib/index_counts.py): the calls it
takes (report calls from the replicas, shared marks and work ends from the routers, mirror
polls), what they carried and the long polls it woke, per request of each phase: what the
CPU is spent on. They move with the box's speed too (how many ends a call or a poll
batches depends on the request rate and the round trips): compare two checkouts (this
script run from each, its directory on PYTHONPATH) over alternating rounds at like loads
(results/bench_cpu_cost.txt).

The last line is a JSON object: per phase, CPU ms per request (burst) or per 1,000 tokens
(streams) for each side and role, the served side's `index_calls_per_request` (burst) and
`index_calls_per_stream` (streams), and `cpu_bound_ratio` ((a) total / (b) total).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.simlib import servers  # noqa: E402
from benchmarks.simlib.index_counts import IndexCounter, per_request  # noqa: E402
from benchmarks.simlib.overhead_client import ClientConfig, OverheadClient  # noqa: E402
from benchmarks.simlib.ray_head import RayHead  # noqa: E402

SIM_ARGS = ["--model", "tiny", "--engine", "sim", "--sim-preset", "tiny"]
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# cmdline marker -> role; the first that matches names the process
ROLES = (("floor:Ingress", "floor app"), ("FloorRouter", "ingress router"),
         ("EngineReplica", "engine"), ("kvroute engine", "engine"),
         ("KVRouteIngressRouter", "ingress router"), ("kvroute:Gateway", "gateway"),
         ("haproxy", "haproxy"), ("ProxyActor", "serve proxy"),
         ("kvroute serve", "kvroute serve driver"), ("KVIndex", "kv index actor"),
         ("MetricsHub", "metrics hub"), ("ServeController", "serve controller"),
         ("HAProxyManager", "serve controller"), ("gcs_server", "ray gcs, raylet"),
         ("raylet", "ray gcs, raylet"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=3000, help="burst requests per side")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--streams", type=int, default=256, help="streams per side")
    p.add_argument("--stream-concurrency", type=int, default=64)
    p.add_argument("--stream-tokens", type=int, default=64)
    p.add_argument("--serve-env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--floor", action="store_true",
                   help="also measure the trivial Serve app behind the same ingress")
    return p.parse_args(argv)


def role_of(cmdline: bytes) -> str:
    for marker, role in ROLES:
        if marker.encode() in cmdline:
            return role
    return "ray and other"


def cpu_by_role(session_ids: set[int]) -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far) for every process of these sessions."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) not in session_ids:
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ProcessLookupError):
            continue  # gone meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        out[int(entry)] = (role_of(cmdline), (int(fields[11]) + int(fields[12])) / TICKS_PER_S)
    return out


def measure(session_ids: set[int], run) -> tuple[dict[str, float], float]:
    """CPU seconds by role (plus the client's) while `run()` goes; and its wall seconds."""
    before, client_before = cpu_by_role(session_ids), time.process_time()
    start = time.perf_counter()
    run()
    wall_s = time.perf_counter() - start
    after, client_s = cpu_by_role(session_ids), time.process_time() - client_before
    spent: dict[str, float] = collections.Counter({"client (this process)": client_s})
    for pid, (role, seconds) in after.items():
        spent[role] += seconds - before.get(pid, (role, 0.0))[1]
    return dict(spent), wall_s


def phase_cost(name: str, urls: list[str], sessions: set[int], args,
               counter: IndexCounter | None = None) -> dict:
    """`counter`: the served side's index actor, read between the phases (outside the CPU
    measured)."""
    client = OverheadClient(ClientConfig(tuple(urls), "tiny"))
    asyncio.run(client.warm_up(16))
    counts = [counter.read()] if counter is not None else []
    burst, burst_s = measure(sessions, lambda: asyncio.run(
        client.burst_req_s(args.requests, args.concurrency)))
    counts += [counter.read()] if counter is not None else []
    streams, streams_s = measure(sessions, lambda: asyncio.run(client.stream_tok_s(
        args.streams, args.stream_concurrency, args.stream_tokens)))
    counts += [counter.read()] if counter is not None else []
    tokens = args.streams * args.stream_tokens
    out = {"burst_cpu_ms_per_request": {r: round(1000 * s / args.requests, 3)
                                        for r, s in sorted(burst.items())},
           "burst_req_s": round(args.requests / burst_s, 1),
           "stream_cpu_ms_per_1k_tokens": {r: round(1e6 * s / tokens, 2)
                                           for r, s in sorted(streams.items())},
           "stream_tok_s": round(tokens / streams_s, 1),
           "load_avg_1m": round(os.getloadavg()[0], 2)}
    out["burst_cpu_ms_per_request"]["total"] = round(
        sum(out["burst_cpu_ms_per_request"].values()), 3)
    out["stream_cpu_ms_per_1k_tokens"]["total"] = round(
        sum(out["stream_cpu_ms_per_1k_tokens"].values()), 2)
    if counts:
        out["index_calls_per_request"] = per_request(counts[0], counts[1], args.requests)
        out["index_calls_per_stream"] = per_request(counts[1], counts[2], args.streams)
    print(f"\n{name}: {out['burst_req_s']} req/s, {out['stream_tok_s']} tok/s "
          f"(load {out['load_avg_1m']})", flush=True)
    for key in ("burst_cpu_ms_per_request", "stream_cpu_ms_per_1k_tokens",
                "index_calls_per_request", "index_calls_per_stream"):
        if key not in out:
            continue
        print(f"  {key}: " + ", ".join(f"{r} {v}" for r, v in out[key].items()), flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    env = dict(pair.split("=", 1) for pair in args.serve_env)
    env = {"RAY_SERVE_HAPROXY_STATS_PORT": str(servers.free_port()),
           "RAY_SERVE_HAPROXY_METRICS_PORT": str(servers.free_port()), **env}
    with tempfile.TemporaryDirectory(prefix="kvroute-bench-cpu-") as tmp:
        workdir = Path(tmp)
        engines = [servers.start(lambda i=i: servers.kvroute_engine(
            SIM_ARGS, workdir / f"engine-{i}.log")) for i in range(2)]
        head = RayHead(workdir)
        server = None
        counter = IndexCounter(head.address)
        try:
            counter.read()  # its driver up (and its actor) before the standalone phase
            standalone = phase_cost("standalone", [e.base_url for e in engines],
                                    {e.proc.pid for e in engines}, args)

            def served_server() -> servers.ServerProcess:
                counter.read()  # the counted index actor first (again after a failed
                # start, which kills it): the server finds it by name
                return servers.kvroute_serve(SIM_ARGS, workdir / "serve.log", 2, env,
                                             head.address)

            server = servers.start(served_server, after_failure=head.reset_serve)
            for engine in engines:  # idle engines cost nothing, but leave the box to (b)
                engine.stop()
            served = phase_cost(f"kvroute serve {env}", [server.base_url],
                                {server.proc.pid, head.pid}, args, counter)
            floor = None
            if args.floor:
                server.stop()
                server = None
                head.reset_serve()
                server = servers.start(lambda: servers.serve_floor(
                    workdir / "floor.log", "direct", {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
                    head.address), after_failure=head.reset_serve)
                floor = phase_cost("floor: trivial Serve app, direct ingress",
                                   [server.base_url], {server.proc.pid, head.pid}, args)
        finally:
            if server is not None:
                server.stop()
            counter.close()
            head.stop()
            for engine in engines:
                engine.stop()
    out = {"standalone": standalone, "served": served, "serve_env": args.serve_env,
           "cpu_bound_req_s_ratio": round(
               standalone["burst_cpu_ms_per_request"]["total"]
               / served["burst_cpu_ms_per_request"]["total"], 3),
           "cpu_bound_stream_ratio": round(
               standalone["stream_cpu_ms_per_1k_tokens"]["total"]
               / served["stream_cpu_ms_per_1k_tokens"]["total"], 3)}
    if floor is not None:
        out["floor"] = floor
        for phase, key in (("burst_cpu_ms_per_request", "floor_bound_req_s_ratio"),
                           ("stream_cpu_ms_per_1k_tokens", "floor_bound_stream_ratio")):
            base = standalone[phase]["total"]
            added = sum(v for role, v in floor[phase].items()
                        if role not in ("floor app", "client (this process)", "total"))
            out[key] = round(base / (base + added), 3)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
