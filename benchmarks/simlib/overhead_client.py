"""The three client phases of bench_overhead.py, against OpenAI `/v1/completions` endpoints.

    idle latency:  1 request in flight, max_tokens 1, not streamed: each request's seconds
    burst:         C requests in flight, max_tokens 1, not streamed: requests per second
    streams:       S streams in flight, N tokens each (ignore_eos): tokens per second

Each request goes to the next base URL in turn (one URL: a router; several: the client
round-robins over standalone replicas itself). Prompts are random token ids, a different
prompt per request, so no replica serves from cache more than another and a cache-aware
router balances on load. Bodies are encoded before the clock starts and responses are
checked without parsing every chunk, so the client spends as little of the shared CPU as it
can. Any failed request fails the phase (a benchmark of errors measures nothing).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from itertools import cycle

import aiohttp
import numpy as np

_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')


@dataclass(frozen=True)
class ClientConfig:
    base_urls: tuple[str, ...]
    model: str
    prompt_tokens: int = 32
    token_low: int = 32  # prompt ids in [token_low, token_high): printable ASCII, which the
    token_high: int = 127  # byte-level tiny model reads as text too
    timeout_s: float = 120.0
    seed: int = 0

    def __post_init__(self):
        if not self.base_urls:
            raise ValueError("ClientConfig: at least one base URL is required")
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {self.prompt_tokens}")


class PhaseFailed(RuntimeError):
    """A request of a phase failed; the phase's figure would be meaningless."""


class OverheadClient:
    def __init__(self, config: ClientConfig):
        self.config = config
        self._rng = np.random.default_rng(config.seed)
        self._urls = cycle([u.rstrip("/") + "/v1/completions" for u in config.base_urls])

    def _bodies(self, n: int, max_tokens: int, stream: bool) -> list[tuple[str, bytes]]:
        ids = self._rng.integers(self.config.token_low, self.config.token_high,
                                 size=(n, self.config.prompt_tokens)).tolist()
        out = []
        for prompt in ids:
            body = {"model": self.config.model, "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0.0, "ignore_eos": True, "stream": stream}
            if stream:
                body["stream_options"] = {"include_usage": True}
            out.append((next(self._urls), json.dumps(body).encode()))
        return out

    async def _session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        return aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     headers={"Content-Type": "application/json"})

    @staticmethod
    async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> bytes:
        async with session.post(url, data=body) as resp:
            data = await resp.read()
            if resp.status != 200:
                raise PhaseFailed(f"HTTP {resp.status} from {url}: {data[:300]!r}")
            return data

    @staticmethod
    def _stream_tokens(url: str, data: bytes, max_tokens: int) -> int:
        if b'"error"' in data or not data.rstrip().endswith(b"data: [DONE]"):
            raise PhaseFailed(f"stream from {url} did not end cleanly: {data[-300:]!r}")
        found = _COMPLETION_TOKENS.findall(data)
        if not found:
            raise PhaseFailed(f"stream from {url} carried no usage: {data[-300:]!r}")
        tokens = int(found[-1])
        if tokens != max_tokens:
            raise PhaseFailed(f"stream from {url} produced {tokens} tokens, not {max_tokens}")
        return tokens

    async def warm_up(self, num_requests: int) -> None:
        """Connections, code paths and the routers' first calls, untimed."""
        async with await self._session() as session:
            for url, body in self._bodies(num_requests, 2, False):
                await self._one(session, url, body)
            await asyncio.gather(*(self._one(session, url, body)
                                   for url, body in self._bodies(num_requests, 4, True)))

    async def idle_latency_s(self, num_requests: int) -> list[float]:
        """Seconds per request, one in flight, max_tokens 1."""
        bodies = self._bodies(num_requests, 1, False)
        out = []
        async with await self._session() as session:
            for url, body in bodies:
                start = time.perf_counter()
                data = await self._one(session, url, body)
                out.append(time.perf_counter() - start)
                if b'"choices"' not in data:
                    raise PhaseFailed(f"no choices from {url}: {data[:300]!r}")
        return out

    async def burst_req_s(self, num_requests: int, concurrency: int) -> float:
        """Requests per second with `concurrency` in flight, max_tokens 1."""
        bodies = self._bodies(num_requests, 1, False)
        return num_requests / await self._run(bodies, concurrency, None)

    async def stream_tok_s(self, num_streams: int, concurrency: int, max_tokens: int
                           ) -> float:
        """Generated tokens per second with `concurrency` streams in flight."""
        bodies = self._bodies(num_streams, max_tokens, True)
        return num_streams * max_tokens / await self._run(bodies, concurrency, max_tokens)

    async def _run(self, bodies: list[tuple[str, bytes]], concurrency: int,
                   stream_tokens: int | None) -> float:
        """Seconds to send every body with `concurrency` in flight."""
        queue = list(reversed(bodies))

        async def worker(session: aiohttp.ClientSession) -> None:
            while queue:
                url, body = queue.pop()
                data = await self._one(session, url, body)
                if stream_tokens is not None:
                    self._stream_tokens(url, data, stream_tokens)

        async with await self._session() as session:
            start = time.perf_counter()
            await asyncio.gather(*(worker(session) for _ in range(concurrency)))
            return time.perf_counter() - start
