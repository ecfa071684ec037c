"""End to end: real `kvroute serve` (2 replicas, real engine on CPU), cache_aware vs
round_robin, over HTTP, in one run.

    python benchmarks/bench_e2e.py

The workload is SGLang's generated-shared-prefix, scaled down: 16 groups x 8 prompts, a
1,024-token system prompt per group, a 64-token question, 32 output tokens, in a shuffled
order, streamed, 16 in flight (all at once would need more KV than the pools hold for the
running requests alone, and both policies would mostly measure eviction). The model is a
random-weight Llama sized so that prefill dominates (worker/model/random_checkpoint.py). Each
replica's KV pool holds half of the system prompts plus working space: all of them fit
across the two replicas, not in one. Each policy gets a fresh server (cold caches), started
with the `kvroute` CLI.

Prints a table and, last, one JSON line: throughput_ratio (cache_aware / round_robin output
tokens per second), ttft_p50_ratio (cache_aware / round_robin), cache_aware_hit_rate
(delivered cached prompt tokens / prompt tokens). `--results` also saves the run to
benchmarks/results/bench_e2e.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.simlib import workloads as wl  # noqa: E402
from benchmarks.simlib.openai_load import LoadConfig, LoadGenerator, summarize_http  # noqa
from benchmarks.simlib.prompts import TokenSource  # noqa: E402
from benchmarks.simlib.results import save_result  # noqa: E402
from kv.hashing import DEFAULT_BLOCK_SIZE  # noqa: E402
from worker.ports import free_port  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--prompts-per-group", type=int, default=8)
    p.add_argument("--system-len", type=int, default=1024)
    p.add_argument("--question-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    p.add_argument("--num-blocks", type=int, default=None,
                   help="KV blocks per replica (default: half the system prompts + 128)")
    p.add_argument("--max-concurrency", type=int, default=16,
                   help="requests in flight (the pool holds 8 running requests per replica "
                        "next to its half of the system prompts)")
    # MLP-heavy and shallow: on this engine's CPU path a cold prefill then costs several
    # times the decode, so the cache decides the speed (benchmarks/NOTEBOOK.md, "End to end").
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--intermediate-size", type=int, default=8192)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--policies", default="cache_aware,round_robin")
    p.add_argument("--load-weight", type=float, default=0.1,
                   help="kvroute serve --load-weight: at 0.5 the long "
                        "CPU prefill queues push a group's requests to the replica without "
                        "its prefix and both replicas end up thrashing (benchmarks/NOTEBOOK.md)")
    p.add_argument("--pending-ttl-s", type=float, default=None,
                   help="kvroute serve --pending-ttl-s (router default when unset)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", action="store_true",
                   help="also save the run to benchmarks/results/bench_e2e.txt")
    return p.parse_args(argv)


def model_config(args: argparse.Namespace) -> dict:
    heads = max(1, args.hidden_size // 64)
    return {"model_type": "llama", "vocab_size": 512, "hidden_size": args.hidden_size,
            "intermediate_size": args.intermediate_size, "num_hidden_layers": args.num_layers,
            "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": 64,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "bos_token_id": 256, "eos_token_id": 257}




class Server:
    """`kvroute serve` in a subprocess, ready when both replicas publish."""

    def __init__(self, model_dir: Path, policy: str, num_blocks: int, args, log_path: Path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [str(ROOT / ".venv/bin/kvroute"), "serve", "--model", str(model_dir),
               "--replicas", "2", "--policy", policy, "--block-size", str(args.block_size),
               "--num-blocks", str(num_blocks), "--engine", "real", "--port", str(self.port),
               "--cpus-per-rank", "1"]
        for flag in ("pending_ttl_s", "load_weight"):
            if getattr(args, flag) is not None:
                cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=ROOT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvroute serve exited with {self.proc.returncode}")
            try:
                ready = httpx.get(f"{self.base_url}/ready", timeout=5).json()
                if len(ready.get("replicas", [])) == 2:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1.0)  # polling a starting server, not synchronisation
        raise RuntimeError("kvroute serve did not become ready")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()


def warm_up(base_url: str, model: str) -> None:
    """One short request per replica first (code paths, allocator), unrelated tokens."""
    for i in range(4):
        httpx.post(f"{base_url}/v1/completions", timeout=120,
                   json={"model": model, "prompt": [40 + i] * 40, "max_tokens": 2})


def per_replica(base_url: str) -> dict[str, dict[str, float]]:
    """Routed requests, delivered hit rate and evicted blocks per replica (from /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {"kvroute_router_requests_total": "requests",
              "kvroute_engine_prefix_cache_hit_tokens_total": "hit",
              "kvroute_engine_prefix_cache_query_tokens_total": "query",
              "kvroute_engine_evictions_total": "evicted_blocks"}
    time.sleep(2.0)  # replicas push their series every second
    out: dict[str, dict[str, float]] = {}
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            key = wanted.get(sample.name)
            if key and "replica" in sample.labels:
                row = out.setdefault(sample.labels["replica"], {})
                row[key] = row.get(key, 0.0) + sample.value
    for row in out.values():
        row["hit_rate"] = round(row.pop("hit", 0.0) / max(row.pop("query", 0.0), 1.0), 3)
    return out


def run_policy(model_dir: Path, policy: str, num_blocks: int, args, workdir: Path) -> dict:
    workload = wl.generated_shared_prefix(args.groups, args.prompts_per_group, args.system_len,
                                          args.question_len, args.output_len, seed=args.seed)
    tokens = TokenSource(args.seed, 32, 127, workload.shared_keys())
    server = Server(model_dir, policy, num_blocks, args, workdir / f"serve-{policy}.log")
    try:
        server.wait_ready()
        warm_up(server.base_url, model_dir.name)
        config = LoadConfig(server.base_url, model_dir.name,
                            max_concurrency=args.max_concurrency)
        records = asyncio.run(LoadGenerator(config, workload, tokens).run())
        summary = summarize_http(records)
        summary["per_replica"] = per_replica(server.base_url)
    finally:
        server.stop()
    if summary["num_errors"]:
        raise RuntimeError(f"{policy}: {summary['num_errors']} requests failed, first: "
                           f"{summary['first_error']}")
    return summary


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from worker.model.random_checkpoint import write_random_checkpoint

    blocks_per_system = args.system_len // args.block_size
    num_blocks = args.num_blocks or args.groups * blocks_per_system // 2 + 128
    with tempfile.TemporaryDirectory(prefix="kvroute-bench-e2e-") as tmp:
        workdir = Path(tmp)
        model_dir = write_random_checkpoint(workdir / "bench-prefill", model_config(args),
                                            seed=args.seed)
        results = {p: run_policy(model_dir, p, num_blocks, args, workdir)
                   for p in args.policies.split(",")}
    ca, rr = results.get("cache_aware"), results.get("round_robin")
    header = (f"{'policy':<14}{'ok':>5}{'ttft p50 s':>12}{'ttft p90 s':>12}"
              f"{'out tok/s':>11}{'hit rate':>10}")
    lines = [header] + [
        f"{p:<14}{s['num_ok']:>5}{s['ttft_p50_s']:>12.3f}{s['ttft_p90_s']:>12.3f}"
        f"{s['throughput_tok_s']:>11.1f}{s['cached_token_rate']:>10.3f}"
        for p, s in results.items()]
    for p, s in results.items():
        lines.append(f"  {p} per replica: {json.dumps(s['per_replica'])}")
    print("\n".join(lines))
    out = {
        "throughput_ratio": round(ca["throughput_tok_s"] / rr["throughput_tok_s"], 3),
        "ttft_p50_ratio": round(ca["ttft_p50_s"] / rr["ttft_p50_s"], 3),
        "cache_aware_hit_rate": round(ca["cached_token_rate"], 3),
        "round_robin_hit_rate": round(rr["cached_token_rate"], 3),
        "num_blocks_per_replica": num_blocks,
        "system_prompt_blocks_total": args.groups * blocks_per_system,
    } if ca and rr else {}
    if args.results and out:
        save_result("bench_e2e", (
            f"real engine, random-weight Llama (hidden {args.hidden_size}, MLP "
            f"{args.intermediate_size}, {args.num_layers} layers), 2 replicas x 1 CPU, "
            f"--load-weight {args.load_weight}, {num_blocks} KV blocks per replica (the "
            f"{args.groups} system prompts need {args.groups * blocks_per_system}); "
            f"{args.groups} groups x {args.prompts_per_group} prompts, {args.system_len}-token "
            f"system prompt, {args.question_len}-token question, {args.output_len} output "
            f"tokens, {args.max_concurrency} in flight, streamed over HTTP\n"
            + "\n".join(lines) + "\n" + json.dumps(out)))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
