"""What one Python HTTP hop costs on this box, beside what kvroute's worker gateway costs.

    python benchmarks/bench_proxy_floor.py

Starts 2 `kvroute engine --engine sim --sim-preset tiny` workers, `kvroute serve --workers`
in front of them (cache-aware, on its routed history: no KV events), and the pass-through
proxy of benchmarks/simlib/floor_proxy.py (the gateway's HTTP stack doing nothing else).
Then one request alone (max_tokens 1) through each and straight to the workers, taking
turns. The last line is a JSON object: kvroute_added_ms and floor_added_ms (p50 over the
direct client), and kvroute_over_floor_ms (kvroute's own work: tokenizing, hashing,
routing, metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.simlib.engine_workers import EngineWorker, stop_all  # noqa: E402
from benchmarks.simlib.gateway_server import free_port, start_gateway, stop_gateway  # noqa
from benchmarks.simlib.overhead_probe import client_for, latency_p50_ms  # noqa: E402
from benchmarks.simlib.servers import PYTHON  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--requests", type=int, default=400, help="per client, taking turns")
    p.add_argument("--prompt-tokens", type=int, default=64)
    return p.parse_args(argv)


def start_floor(urls: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([PYTHON, "-m", "benchmarks.simlib.floor_proxy", str(port), *urls],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):  # it prints before uvicorn binds: poll the port
        try:
            httpx.post(f"{base}/v1/completions", timeout=5, json={
                "model": "tiny", "prompt": [40], "max_tokens": 1}).raise_for_status()
            return proc, base
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise RuntimeError("the floor proxy exited") from None
            time.sleep(0.1)  # polling a starting server, not synchronisation
    raise RuntimeError("the floor proxy did not answer in 60 s")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    workers = [EngineWorker() for _ in range(args.workers)]
    floor = server = None
    try:
        for w in workers:
            w.wait_ready(timeout_s=600.0)
        urls = [w.url for w in workers]
        floor, floor_url = start_floor(urls)
        with tempfile.TemporaryDirectory(prefix="kvroute-proxy-floor-") as tmp:
            server = start_gateway(urls, ["--approximate"], Path(tmp) / "serve.log",
                                   events=False)

            async def measure() -> dict[str, float]:
                clients = {"direct": client_for(None, urls),
                           "floor": client_for(floor_url, urls),
                           "kvroute": client_for(server.base_url, urls)}
                try:
                    return await latency_p50_ms(clients, "tiny", args.requests,
                                                args.prompt_tokens)
                finally:
                    for c in clients.values():
                        await c.aclose()

            p50 = asyncio.run(measure())
            load = os.getloadavg()[0]
    finally:
        if server is not None:
            stop_gateway(server, None)
        if floor is not None:
            floor.kill()
            floor.wait()
        stop_all(workers)
    out = {"kvroute_added_ms": round(p50["kvroute"] - p50["direct"], 2),
           "floor_added_ms": round(p50["floor"] - p50["direct"], 2),
           "kvroute_over_floor_ms": round(p50["kvroute"] - p50["floor"], 2),
           "direct_p50_ms": round(p50["direct"], 2), "load_avg_1m": round(load, 2)}
    print(f"p50 ms, one request alone: direct {p50['direct']:.2f}, floor proxy "
          f"{p50['floor']:.2f}, kvroute {p50['kvroute']:.2f} (load 1m {load:.2f})")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
