"""The victim tenant: one client streaming completions that share a long prefix, back to
back, each one's outcome recorded under the phase it ran in.

A victim request is served when its stream ends with a finish reason and `[DONE]`, and it
is on its cache when its usage counts the shared prefix's full blocks as cached: the
engines cache on their own, so a hit is the proof it went to the replica that holds the
prefix (the first request of a run computes it).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import httpx
import numpy as np

BLOCK_TOKENS = 16
SHARED_PREFIX = "You are the victim's assistant; answer from the shared manual. " * 12
# bytes + BOS, whole blocks only (the tiny model's tokenizer is byte level)
PREFIX_CACHED_TOKENS = (len(SHARED_PREFIX.encode()) + 1) // BLOCK_TOKENS * BLOCK_TOKENS
MAX_TOKENS = 16
DEADLINE_S = 60.0


@dataclass(frozen=True)
class VictimResult:
    phase: str
    start_s: float  # time.monotonic()
    end_s: float
    ok: bool
    ttft_s: float | None
    cached_tokens: int | None
    error: str | None


def stream_once(base_url: str, headers: dict[str, str], prompt: str,
                client: httpx.Client) -> tuple[bool, float | None, int | None, str | None]:
    """One streamed completion: (served, TTFT, cached prompt tokens, what went wrong)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft = cached = finish = None
    done = False
    try:
        with client.stream("POST", f"{base_url}/v1/completions", json=body, headers=headers,
                           timeout=DEADLINE_S) as resp:
            if resp.status_code != 200:
                return False, None, None, f"{resp.status_code} {resp.read()[:200]!r}"
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    return False, ttft, None, f"error event {event['error']}"
                if event.get("choices"):
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    finish = event["choices"][0].get("finish_reason") or finish
                if event.get("usage"):
                    details = event["usage"].get("prompt_tokens_details") or {}
                    cached = details.get("cached_tokens", 0)
    except (httpx.HTTPError, ValueError) as err:
        return False, ttft, cached, f"{type(err).__name__}: {err}"
    if not (done and finish == "length"):
        return False, ttft, cached, f"stream ended without finishing ({finish}, done={done})"
    return True, ttft, cached, None


class Victim:
    """Streams back to back in a thread from `start()` to `stop()`; `phase` labels what
    runs meanwhile."""

    def __init__(self, base_url: str, headers: dict[str, str]):
        self.base_url, self.headers = base_url, headers
        self.phase = "warmup"
        self.results: list[VictimResult] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._i = 0

    def request(self) -> VictimResult:
        self._i += 1
        start_s = time.monotonic()
        with httpx.Client() as client:
            ok, ttft, cached, error = stream_once(
                self.base_url, self.headers, SHARED_PREFIX + f"Victim question {self._i}?",
                client)
        return VictimResult(self.phase, start_s, time.monotonic(), ok, ttft, cached, error)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.results.append(self.request())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(DEADLINE_S + 10)

    def of(self, phase: str) -> list[VictimResult]:
        return [r for r in self.results if r.phase == phase]

    def summary(self, phase: str) -> dict:
        rs = self.of(phase)
        ttfts = [r.ttft_s for r in rs if r.ok and r.ttft_s is not None]
        return {"requests": len(rs), "failed": sum(not r.ok for r in rs),
                "off_cache": sum(r.ok and (r.cached_tokens or 0) < PREFIX_CACHED_TOKENS
                                 for r in rs),
                "ttft_p50_s": float(np.median(ttfts)) if ttfts else None,
                "errors": sorted({r.error for r in rs if r.error})[:5]}
