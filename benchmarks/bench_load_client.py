"""What the load generator's HTTP client adds to the TTFT it measures.

    python benchmarks/bench_load_client.py [--requests 128] [--rounds 3]

A server that answers every streamed completion at once (aiohttp, in its own process, first
event as soon as the body is read) gets N requests at once with a 1,088-token id prompt,
as bench_external.py sends them; the median time to the first event is what the client and
the loopback cost, with no engine behind them. Measured with httpx (the load generator's
client before) and aiohttp (its client now), taking turns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.simlib import servers  # noqa: E402

SERVER = """
import sys
from aiohttp import web
async def completions(request):
    await request.read()
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"choices":[{"text":"x"}]}\\n\\n')
    await response.write(b"data: [DONE]\\n\\n")
    await response.write_eof()
    return response
app = web.Application()
app.router.add_post("/v1/completions", completions)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""
BODY = {"model": "m", "prompt": list(range(1000, 2088)), "max_tokens": 32, "stream": True}


async def with_httpx(url: str, n: int) -> float:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        async def one() -> float:
            start = time.perf_counter()
            async with client.stream("POST", url, json=BODY) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        return time.perf_counter() - start
            raise RuntimeError("no event")
        return statistics.median(await asyncio.gather(*(one() for _ in range(n))))


async def with_aiohttp(url: str, n: int) -> float:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        async def one() -> float:
            start = time.perf_counter()
            async with client.post(url, json=BODY) as resp:
                async for line in resp.content:
                    if line.startswith(b"data:"):
                        return time.perf_counter() - start
            raise RuntimeError("no event")
        return statistics.median(await asyncio.gather(*(one() for _ in range(n))))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    port = servers.free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        deadline = time.monotonic() + 30
        while True:  # until the server answers
            try:
                asyncio.run(with_aiohttp(url, 1))
                break
            except aiohttp.ClientConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.05)  # polling for the port to open
        medians: dict[str, list[float]] = {"httpx": [], "aiohttp": []}
        for _ in range(args.rounds):
            medians["httpx"].append(asyncio.run(with_httpx(url, args.requests)) * 1e3)
            medians["aiohttp"].append(asyncio.run(with_aiohttp(url, args.requests)) * 1e3)
        for name, values in medians.items():
            print(f"{name:8} median time to first event, {args.requests} at once: "
                  + ", ".join(f"{v:.1f}" for v in values) + " ms")
    finally:
        server.terminate()
        server.wait()
    out = {f"{name}_ttft_p50_ms": round(statistics.median(v), 1) for name, v in medians.items()}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
