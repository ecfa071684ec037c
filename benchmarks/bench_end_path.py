"""How late a direct request's end reaches the router that routed it.

    python benchmarks/bench_end_path.py [--tree before=DIR --tree after=DIR] [--rounds 2]

On the default path (`--ingress direct`) the engine replica streams the answer and the
ingress router only picks it, so the router's load holds each request until the replica's
report of its end comes back (router/serve/route_tracking.py). Each router measures that
wait, from the end on the replica (its clock; one box here) to the release in its ledger, as
the histogram kvroute_router_end_delay_seconds. This script starts `kvroute serve --engine
sim` (2 replicas, preset tiny, direct ingress behind HAProxy), sends --requests completions
(half streamed) from --concurrency clients, waits until every end is counted, and prints the
histogram's p50/p90/p99 (interpolated within its buckets, as Prometheus' histogram_quantile)
and mean. With several --tree NAME=DIR, each round runs every tree in turn (its checkout on
PYTHONPATH), so two versions of the end path are measured side by side under the same load.

Last line: a JSON object with each tree's rounds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.router.serve.cli_server import kvroute_cli_server  # noqa: E402
from tests.router.serve.serve_helpers import wait_until  # noqa: E402

METRIC = "kvroute_router_end_delay_seconds"
FLAGS = ["--model", "tiny", "--ingress", "direct", "--engine", "sim", "--sim-preset", "tiny",
         "--num-blocks", "512"]


def end_delay_buckets(base_url: str) -> dict[float, float]:
    """The histogram's cumulative bucket counts, summed over the routers: {le: count}."""
    out: dict[float, float] = {}
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{METRIC}_bucket":
                le = float(sample.labels["le"])
                out[le] = out.get(le, 0.0) + sample.value
            elif sample.name == f"{METRIC}_sum":
                out[-1.0] = out.get(-1.0, 0.0) + sample.value  # the sum, under key -1
    return out


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """histogram_quantile over cumulative {le: count} (no -1 key): linear in a bucket."""
    bounds = sorted(le for le in buckets if le >= 0)
    total = buckets[float("inf")]
    if not total:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if le == float("inf"):
                return lower  # past the last finite bound: its bound
            return lower + (le - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = le, count
    return lower


def send(base_url: str, i: int, max_tokens: int) -> None:
    body = {"model": "tiny", "prompt": f"Request {i} of the end-path run, its own prompt.",
            "max_tokens": max_tokens, "ignore_eos": True, "stream": i % 2 == 0}
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    response.read()


def run_once(args: argparse.Namespace, tree: str | None, workdir: Path) -> dict:
    env_path, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
    if tree is not None:  # Ray's workers import from the driver's directory first
        os.environ["PYTHONPATH"] = tree
        os.chdir(tree)
    try:
        with kvroute_cli_server(FLAGS, 2, workdir / "serve.log", routed_probe={}) as server:
            url = server.base_url
            before = _fresh_buckets(url)  # the readiness probes' ends are in
            start_s = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                list(pool.map(lambda i: send(url, i, args.max_tokens), range(args.requests)))
            elapsed_s = time.monotonic() - start_s
            want = before.get(float("inf"), 0.0) + args.requests
            after = wait_until(lambda: _at_least(url, want), 30,
                               f"{args.requests} ends counted by the routers")
    finally:
        os.chdir(cwd)
        if env_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_path
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    count = delta[float("inf")]
    return {"requests": args.requests, "ends_counted": count,
            "requests_per_s": round(args.requests / elapsed_s, 1),
            "mean_ms": round(1000 * delta[-1.0] / count, 2),
            **{f"p{int(q * 100)}_ms": round(1000 * quantile(delta, q), 2)
               for q in (0.5, 0.9, 0.99)}}


def _fresh_buckets(url: str) -> dict[float, float]:
    """The buckets as the routers pushed them after this call began: read once every
    router's series were refreshed twice since (kvroute_router_series_refreshes_total)."""
    first = _refreshes(url)
    wait_until(lambda: all(_refreshes(url).get(g, 0) >= n + 2 for g, n in first.items()),
               30, "every router to push its series twice")
    return end_delay_buckets(url)


def _refreshes(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {s.labels["gateway"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "kvroute_router_series_refreshes_total"}


def _at_least(url: str, want: float) -> dict[float, float] | None:
    buckets = end_delay_buckets(url)
    return buckets if buckets.get(float("inf"), 0.0) >= want else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", default=[],
                   help="NAME=DIR: a checkout to run (on PYTHONPATH); default: this one")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    args = p.parse_args()
    trees = [tuple(t.split("=", 1)) for t in args.tree] or [("this", None)]
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    load = [os.getloadavg()[0]]
    for round_i in range(args.rounds):
        for name, tree in trees:
            with tempfile.TemporaryDirectory() as workdir:
                result = run_once(args, tree, Path(workdir))
            result["load_1m"] = round(os.getloadavg()[0], 2)
            results[name].append(result)
            print(f"round {round_i} {name}: {result}", flush=True)
    load.append(os.getloadavg()[0])
    print(json.dumps({"metric": METRIC, "results": results,
                      "load_1m_start_end": [round(x, 2) for x in load]}))


if __name__ == "__main__":
    main()
