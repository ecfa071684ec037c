"""An open-loop HTTP load generator for OpenAI-compatible `/v1/completions` endpoints.

Each workload item is sent at its arrival time (a multi-turn round no earlier than the
answer to its previous round), streamed over SSE with `stream_options.include_usage`, and
timed: TTFT is the first chunk that carries a choice, TPOT the time after it over the
remaining completion tokens. `usage.prompt_tokens_details.cached_tokens` is the server's
own count of prompt tokens it served from cache.

Prompts go as token id lists by default (`prompt: [ids]`, which the OpenAI API accepts), so
every server sees exactly the workload's tokens. In text mode each id is one character
(chr(id), ids in the printable ASCII range by default), which kvroute's byte-level tokenizer
maps back to the same ids; other tokenizers see text of a similar length. A multi-turn
round's history is the previous prompt plus the answer: its text, or in ids mode its UTF-8
bytes as ids (exact for byte-level tokenizers).

The client is aiohttp, as SGLang's and vLLM's serving benchmarks use: the client's own cost
per request lands in every TTFT it measures, and with 128 streams sent at once httpx's added
70-110 ms to the median where aiohttp's adds about 25 (benchmarks/NOTEBOOK.md, "External
workers").
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import numpy as np

from benchmarks.simlib.prompts import TokenSource
from benchmarks.simlib.workloads import WorkItem, Workload


@dataclass(frozen=True)
class LoadConfig:
    base_url: str
    model: str
    prompt_format: str = "ids"  # ids | text
    max_concurrency: int | None = None
    api_key: str | None = None
    timeout_s: float = 600.0

    def __post_init__(self):
        if self.prompt_format not in ("ids", "text"):
            raise ValueError(f"prompt_format must be ids or text, got {self.prompt_format!r}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")


@dataclass
class HttpRecord:
    request_id: str
    sent_s: float  # since the start of the run
    first_chunk_s: float | None = None
    done_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    prompt: list[int] | str | None = None  # as sent (for a bound over the same prompts)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_chunk_s is None else self.first_chunk_s - self.sent_s


class LoadGenerator:
    def __init__(self, config: LoadConfig, workload: Workload, tokens: TokenSource,
                 base_urls: Sequence[str] | None = None):
        """Sends to `config.base_url`, or to each of `base_urls` in turn (a client that
        round-robins over the servers itself)."""
        self.config = config
        self.workload = workload
        self.tokens = tokens
        self._urls = itertools.cycle([f"{u.rstrip('/')}/v1/completions"
                                      for u in (base_urls or [config.base_url])])
        self.records: list[HttpRecord] = []
        self._children = {it.parent_id: it for it in workload.items if it.parent_id}
        self._t0 = 0.0

    async def run(self) -> list[HttpRecord]:
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key \
            else {}
        self._sem = asyncio.Semaphore(self.config.max_concurrency or 1 << 30)
        async with aiohttp.ClientSession(
                headers=headers, connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=self.config.timeout_s)) as client:
            self._client = client
            self._t0 = time.perf_counter()
            roots = [it for it in self.workload.items if it.parent_id is None]
            await asyncio.gather(*(self._session(it, None) for it in roots))
        return self.records

    @property
    def t0(self) -> float:
        """The run's start (a time.perf_counter() value): record times count from it."""
        return self._t0

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    async def _session(self, item: WorkItem, history: list[int] | str | None) -> None:
        """Sends the item at its arrival time, then its next rounds after each answer."""
        while True:
            wait_s = max(item.arrival_s - self._now(),
                         item.think_s if history is not None else 0.0)
            if wait_s > 0:
                await asyncio.sleep(wait_s)  # open-loop pacing, not synchronisation
            prompt = self._prompt(item, history)
            async with self._sem:
                text = await self._send(item, prompt)
            child = self._children.get(item.request_id)
            if child is None:
                return
            if isinstance(prompt, str):
                history = prompt + text
            else:
                history = prompt + list(text.encode("utf-8"))
            item = child

    def _prompt(self, item: WorkItem, history: list[int] | str | None) -> list[int] | str:
        ids = np.concatenate([self.tokens.tokens(s) for s in item.segments]).tolist()
        if self.config.prompt_format == "text":
            return (history or "") + "".join(map(chr, ids))  # type: ignore[operator]
        return (history or []) + ids  # type: ignore[operator]

    async def _send(self, item: WorkItem, prompt: list[int] | str) -> str:
        rec = HttpRecord(item.request_id, self._now(), prompt=prompt)
        self.records.append(rec)
        body = {"model": self.config.model, "prompt": prompt, "max_tokens": item.max_tokens,
                "stream": True, "stream_options": {"include_usage": True},
                "ignore_eos": True, "temperature": 0.0}
        pieces: list[str] = []
        try:
            async with self._client.post(next(self._urls), json=body) as resp:
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                    return ""
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    self._on_chunk(rec, json.loads(data), pieces)
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            rec.error = f"{type(err).__name__}: {err}"
        rec.done_s = self._now()
        return "".join(pieces)

    def _on_chunk(self, rec: HttpRecord, chunk: dict, pieces: list[str]) -> None:
        if "error" in chunk:
            rec.error = str(chunk["error"])[:200]
            return
        if chunk.get("choices"):
            if rec.first_chunk_s is None:
                rec.first_chunk_s = self._now()
            pieces.append(chunk["choices"][0].get("text") or "")
        usage = chunk.get("usage")
        if usage:
            rec.prompt_tokens = usage.get("prompt_tokens", 0)
            rec.completion_tokens = usage.get("completion_tokens", 0)
            rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get(
                "cached_tokens", 0) or 0


def summarize_http(records: list[HttpRecord]) -> dict:
    ok = [r for r in records if r.error is None and r.first_chunk_s is not None]
    ttfts = [r.ttft_s for r in ok]
    tpots = [(r.done_s - r.first_chunk_s) / (r.completion_tokens - 1)  # type: ignore
             for r in ok if r.completion_tokens > 1]
    prompt = sum(r.prompt_tokens for r in ok)
    out_tokens = sum(r.completion_tokens for r in ok)
    span = (max(r.done_s for r in ok) - min(r.sent_s for r in ok)) if ok else 0.0  # type: ignore

    def pct(q: float) -> float:
        return float(np.percentile(ttfts, q)) if ttfts else math.nan

    return dict(num_requests=len(records), num_ok=len(ok),
                num_errors=sum(r.error is not None for r in records),
                first_error=next((r.error for r in records if r.error), None),
                ttft_p50_s=pct(50), ttft_p90_s=pct(90), ttft_p99_s=pct(99),
                tpot_mean_s=float(np.mean(tpots)) if tpots else math.nan,
                throughput_tok_s=out_tokens / span if span > 0 else math.nan,
                prompt_tokens=prompt, completion_tokens=out_tokens,
                cached_tokens=sum(r.cached_tokens for r in ok),
                cached_token_rate=sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0)
