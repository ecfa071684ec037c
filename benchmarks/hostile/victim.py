"""The victim tenant: one client streaming completions that share a long prefix, back to
back, each one's outcome recorded under the phase it ran in.

A victim request is served when its stream ends with a finish reason and `[DONE]`, and it
is on its cache when its usage counts the shared prefix's full blocks as cached: the
engines cache on their own, so a hit is the proof it went to the replica that holds the
prefix (the first request of a run computes it).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from benchmarks.hostile.client import SSL_CONTEXT

ROOT = Path(__file__).resolve().parents[2]
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


def _question(i: int) -> str:
    return SHARED_PREFIX + f"Victim question {i}?"


def _one(base_url: str, headers: dict[str, str], phase: str, i: int) -> VictimResult:
    start_s = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the box
    with httpx.Client(verify=SSL_CONTEXT) as client:
        ok, ttft, cached, error = stream_once(base_url, headers, _question(i), client)
    return VictimResult(phase, start_s, time.monotonic(), ok, ttft, cached, error)


def _main() -> None:
    """The victim's own process (`python -m benchmarks.hostile.victim URL HEADERS PHASE I`):
    requests back to back until its stdin closes, each result a JSON line on stdout as it
    ends, after a first line "ready"."""
    base_url, headers, phase, first_i = sys.argv[1:5]
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # returns at EOF: the harness closed it
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    print("ready", flush=True)
    i = int(first_i)
    while not stop.is_set():
        print(json.dumps(dataclasses.asdict(_one(base_url, json.loads(headers), phase, i))),
              flush=True)
        i += 1


class Victim:
    """Streams back to back from `start()` to `stop()`; `phase` labels what runs meanwhile.

    The stream runs in a process of its own, as a real tenant's client would: in a thread of
    the harness its timings shared one interpreter lock with the hostile tenant's client
    (the fuzzer's case generation is CPU-bound), and measured that client as much as the
    server. `request()` runs one request in this process (nothing else runs then)."""

    def __init__(self, base_url: str, headers: dict[str, str]):
        self.base_url, self.headers = base_url, headers
        self.phase = "warmup"
        self.results: list[VictimResult] = []
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._i = 0

    def request(self) -> VictimResult:
        self._i += 1
        return _one(self.base_url, self.headers, self.phase, self._i)

    def start(self) -> None:
        """Returns once the victim's process is about to send its first request."""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.hostile.victim", self.base_url,
             json.dumps(self.headers), self.phase, str(self._i + 1)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self._proc.stdout.readline().strip() != "ready":
            self._proc.kill()
            raise RuntimeError("the victim's process did not start")
        self._reader = threading.Thread(target=self._collect, args=(self._proc.stdout,),
                                        daemon=True)
        self._reader.start()

    def _collect(self, lines) -> None:
        for line in lines:  # ends when the process exits
            self.results.append(VictimResult(**json.loads(line)))
            self._i += 1

    def stop(self) -> None:
        """Lets the request in flight end, then the process."""
        if self._proc is None:
            return
        self._proc.stdin.close()
        try:
            self._proc.wait(DEADLINE_S + 10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._reader is not None:
            self._reader.join()
        self._proc = None

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


if __name__ == "__main__":
    _main()
