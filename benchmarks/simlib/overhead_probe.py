"""What a proxy in front of the workers costs: latency of one request alone, and streamed
tokens per second with many streams in flight, through a URL or straight to the workers
round robin (the client-side baseline)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Sequence

import httpx
import numpy as np


class RoundRobinTransport(httpx.AsyncBaseTransport):
    """Sends each request to the next worker in turn (whatever host the URL names)."""

    def __init__(self, worker_urls: Sequence[str]):
        self._targets = itertools.cycle([httpx.URL(u) for u in worker_urls])
        self._inner = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        target = next(self._targets)
        request.url = request.url.copy_with(scheme=target.scheme, host=target.host,
                                            port=target.port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def client_for(base_url: str | None, worker_urls: Sequence[str]) -> httpx.AsyncClient:
    """A client to `base_url`, or (None) straight to the workers round robin."""
    if base_url is None:
        return httpx.AsyncClient(base_url="http://workers", timeout=600,
                                 transport=RoundRobinTransport(worker_urls))
    return httpx.AsyncClient(base_url=base_url, timeout=600, limits=httpx.Limits(
        max_connections=None, max_keepalive_connections=512))


async def latency_p50_ms(clients: dict[str, httpx.AsyncClient], model: str,
                         num_requests: int, prompt_tokens: int) -> dict[str, float]:
    """p50 latency (ms) of one request alone (max_tokens 1), per client; the clients take
    turns, so slow drifts of the box hit them alike."""
    body = {"model": model, "prompt": list(range(40, 40 + prompt_tokens)), "max_tokens": 1}
    for client in clients.values():  # connections, caches, code paths
        for _ in range(10):
            (await client.post("/v1/completions", json=body)).raise_for_status()
    samples: dict[str, list[float]] = {name: [] for name in clients}
    for _ in range(num_requests):
        for name, client in clients.items():
            start = time.perf_counter()
            (await client.post("/v1/completions", json=body)).raise_for_status()
            samples[name].append(time.perf_counter() - start)
    return {name: float(np.median(s)) * 1e3 for name, s in samples.items()}


async def stream_tok_s(client: httpx.AsyncClient, model: str, num_streams: int,
                       concurrency: int, tokens_per_stream: int, prompt_tokens: int) -> float:
    """Streamed completion tokens per second (the usage chunk's count), `concurrency`
    streams in flight."""
    sem = asyncio.Semaphore(concurrency)
    received = 0

    async def one(i: int) -> None:
        nonlocal received
        body = {"model": model, "max_tokens": tokens_per_stream, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True,
                "prompt": [40 + i % 80] + [41] * (prompt_tokens - 1)}
        async with sem:
            async with client.stream("POST", "/v1/completions", json=body) as resp:
                resp.raise_for_status()
                async for line in resp.aiter_lines():
                    if '"usage":{' in line:
                        received += json.loads(line[6:])["usage"]["completion_tokens"]
                    elif line.startswith("data: [DONE]"):
                        break

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(num_streams)))
    return received / (time.perf_counter() - start)
