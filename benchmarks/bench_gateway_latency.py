"""Gateway-side against engine-side latency (docs/metrics.md, "Gateway latency").

Runs `kvroute serve --engine sim` (2 replicas, h100-llama3-8b timings) with the given
ingress, sends a shared-prefix load (half streamed) and prints, from the server's own
/metrics, the mean of each kvroute_gateway_*_seconds histogram next to the engine's:
what the front adds to TTFT and end-to-end latency, and how much of TTFT is queue and
preprocessing. Last line: a JSON object.

    python benchmarks/bench_gateway_latency.py [--ingress direct|gateway] [--requests 40]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dashboards.live import KvrouteSim, wait_until  # noqa: E402

STAGES = ("preprocess", "queue", "ttft", "tpot", "e2e")


def histogram_sums(url: str) -> dict[str, float]:
    """Each *_seconds_sum / _count series of the gateway and engine histograms, summed."""
    out: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(("kvroute_gateway_", "kvroute_engine_")) and (
                    sample.name.endswith(("_seconds_sum", "_seconds_count"))):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def send(url: str, i: int, max_tokens: int) -> None:
    body = {"model": "tiny", "prompt": "System prompt of the measurement. " * 8 + f"q{i}",
            "max_tokens": max_tokens, "ignore_eos": True, "stream": i % 2 == 0}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ingress", choices=("direct", "gateway"), default="direct")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    kvroute = str(Path(sys.executable).with_name("kvroute"))
    server = KvrouteSim(kvroute, Path(tempfile.mkdtemp()), 2,
                        ("--ingress", args.ingress, "--sim-preset", "h100-llama3-8b"))
    try:
        server.wait_ready()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(lambda i: send(server.url, i, args.max_tokens),
                          range(args.requests)))
        # every process's series reach the hub within a push interval
        sums = wait_until(lambda: (lambda s: s if s.get(
            "kvroute_gateway_e2e_seconds_count") == args.requests and s.get(
            "kvroute_engine_e2e_seconds_count") == args.requests else None)(
            histogram_sums(server.url)), 30, "every request in the histograms")
    finally:
        server.stop()
    result: dict[str, float | str] = {"ingress": args.ingress, "requests": args.requests}
    for stage in STAGES:
        for side in ("gateway", "engine"):
            count = sums.get(f"kvroute_{side}_{stage}_seconds_count")
            if count:
                mean_ms = sums[f"kvroute_{side}_{stage}_seconds_sum"] / count * 1000
                result[f"{side}_{stage}_mean_ms"] = round(mean_ms, 2)
                print(f"{side:8s} {stage:10s} n={count:.0f} mean {mean_ms:8.2f} ms")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
