"""Two systems measured in alternating rounds, so a shared, noisy box loads both alike.

Each round runs the three phases (benchmarks/simlib/overhead_client.py) against system A,
then against system B; a system's figures are the median over rounds of each phase's
figure (the latency p50 over all of its requests), and a ratio compares two systems' figures
measured side by side, minutes apart at most.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import numpy as np

from benchmarks.simlib.overhead_client import ClientConfig, OverheadClient


@dataclass(frozen=True)
class PhaseConfig:
    idle_requests: int = 100
    burst_requests: int = 500
    burst_concurrency: int = 32
    streams: int = 128
    stream_concurrency: int = 64
    stream_tokens: int = 64
    prompt_tokens: int = 32

    def __post_init__(self):
        for name in ("idle_requests", "burst_requests", "burst_concurrency", "streams",
                     "stream_concurrency", "stream_tokens", "prompt_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"PhaseConfig: {name} must be >= 1")


class SystemFigures:
    """One system's samples over the rounds."""

    def __init__(self, name: str):
        self.name = name
        self.latencies_s: list[float] = []
        self.req_s: list[float] = []
        self.stream_tok_s: list[float] = []
        self.load_avg_1m: list[float] = []

    def summary(self) -> dict:
        return {"latency_p50_ms": round(float(np.percentile(self.latencies_s, 50)) * 1e3, 2),
                "latency_p90_ms": round(float(np.percentile(self.latencies_s, 90)) * 1e3, 2),
                "req_s": round(float(np.median(self.req_s)), 1),
                "stream_tok_s": round(float(np.median(self.stream_tok_s)), 1),
                "rounds": len(self.req_s),
                "load_avg_1m": [round(min(self.load_avg_1m), 2),
                                round(max(self.load_avg_1m), 2)]}

    def line(self) -> str:
        s = self.summary()
        return (f"{self.name:<18}{s['latency_p50_ms']:>9.2f}{s['latency_p90_ms']:>9.2f}"
                f"{s['req_s']:>10.1f}{s['stream_tok_s']:>13.1f}   {s['rounds']} rounds, "
                f"load {s['load_avg_1m']}")


async def _one_round(client: OverheadClient, config: PhaseConfig,
                     figures: SystemFigures) -> None:
    figures.load_avg_1m.append(os.getloadavg()[0])
    figures.latencies_s += await client.idle_latency_s(config.idle_requests)
    figures.req_s.append(await client.burst_req_s(config.burst_requests,
                                                  config.burst_concurrency))
    figures.stream_tok_s.append(await client.stream_tok_s(
        config.streams, config.stream_concurrency, config.stream_tokens))


def paired_rounds(systems: dict[str, list[str]], config: PhaseConfig,
                  num_rounds: int) -> dict[str, SystemFigures]:
    """Runs `num_rounds` rounds over `systems` (name -> base URLs, in order) and returns
    each system's figures."""
    clients = {name: OverheadClient(ClientConfig(tuple(urls), "tiny", config.prompt_tokens,
                                                 seed=i))
               for i, (name, urls) in enumerate(systems.items())}
    figures = {name: SystemFigures(name) for name in systems}

    async def run() -> None:
        for client in clients.values():
            await client.warm_up(8)
        for _ in range(num_rounds):
            for name, client in clients.items():
                await _one_round(client, config, figures[name])

    asyncio.run(run())
    return figures
