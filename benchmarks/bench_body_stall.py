"""How long one hostile body holds a front's event loop: a victim's TTFT while it is sent.

    python benchmarks/bench_body_stall.py [--before REV] [--rounds 2] [--reps 3]
                                          [--max-model-len TOKENS]

`kvroute engine --engine sim --sim-preset tiny` (one process, one event loop: what every
front's parsing shares) from two source trees, alternating: this checkout, and REV
(`git archive` into a temporary directory, default the commit before the body-shape check),
at the tiny model's 2,048-token context or at --max-model-len (a pool that holds it): at a
long context a batch of prompts may legally hold a million token ids, so such a body is
parsed whatever the checks.
In each, a victim process streams 1-token completions back to back while this process sends
each family's body once (--reps times, 0.25 s apart) and waits for its answer. A family's
stall is the worst victim TTFT among the victim requests that overlapped that body (from
sending it to its answer), against the victim's p50 TTFT outside every body. The families
are bench_hostile's huge lists (benchmarks/hostile/attacks.py), each within the 8 MiB cap,
and a batch of ~1M token ids in prompts that each fit the context, refused only after it is
parsed and validated (n = 9 takes it over the 128-sequence cap): the cost of the largest
body a front must parse.

Prints a line per tree and round, then one JSON line: per tree, the victim's baseline p50
and each family's stall (the median over rounds x reps of the worst overlapping TTFT) and
answer statuses, with the box's load.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.simlib.engine_workers import SIM_TINY_ARGS, EngineWorker  # noqa: E402
from worker.tokenizer.files import TINY_MAX_POSITION_EMBEDDINGS  # noqa: E402

DEFAULT_BEFORE = "982954c^"  # the commit before the body-shape check
GAP_S = 0.25


def bodies(max_model_len_tokens: int) -> dict[str, bytes]:
    ids = json.dumps(list(range(1_000_000)))  # ~7 MB
    def completion(extra: str, prompt: str = '"hostile"') -> bytes:
        return f'{{"model": "tiny", "max_tokens": 1, "prompt": {prompt}{extra}}}'.encode()
    fits = max_model_len_tokens - 1  # a prompt's ids, with one output token
    num_prompts = 1_000_000 // fits
    batch = json.dumps([[7] * fits] * num_prompts)  # 2 bytes an id: ~2 MB
    return {
        f"batch {num_prompts} x {fits} ids, n=9": completion(', "n": 9', batch),
        "prompt 1M ids": completion("", ids),
        "stop_token_ids 1M ids": completion(f', "stop_token_ids": {ids}'),
        "logit_bias 200k entries": completion(', "logit_bias": {' + ", ".join(
            f'"{i}": 100' for i in range(200_000)) + "}"),
        "stop 100k strings": completion(', "stop": ' + json.dumps(
            [f"s{i}" for i in range(100_000)])),
        "prompt 100k strings": completion("", json.dumps(["x"] * 100_000)),
        "100k chat messages": ('{"model": "tiny", "max_tokens": 1, "messages": ' + json.dumps(
            [{"role": "user", "content": "x"}] * 100_000) + "}").encode(),
    }


def victim(base_url: str, stop, out) -> None:
    """Streams 1-token completions back to back; puts (sent, first event) monotonic times."""
    body = {"model": "tiny", "prompt": "a victim's short question", "max_tokens": 1,
            "stream": True}
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            sent = time.monotonic()
            with client.stream("POST", f"{base_url}/completions", json=body) as resp:
                first = None
                for line in resp.iter_lines():
                    if first is None and line.startswith("data: "):
                        first = time.monotonic()
            out.put((sent, first))
    out.put(None)


def source_tree(rev: str, into: Path) -> Path:
    """REV's tracked files under `into` (nothing of the repository's state changes)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def engine_args(max_model_len_tokens: int | None) -> tuple[str, ...]:
    if max_model_len_tokens is None:
        return SIM_TINY_ARGS
    num_blocks = -(-max_model_len_tokens // 16)  # the default 16-token blocks: one context
    return (*SIM_TINY_ARGS, "--max-model-len", str(max_model_len_tokens),
            "--num-blocks", str(num_blocks))


def one_run(tree: Path, attacks: dict[str, bytes], reps: int,
            max_model_len_tokens: int | None) -> dict:
    """The engine from `tree`, the victim streaming, each body sent `reps` times."""
    os.environ["PYTHONPATH"] = str(tree)  # the engine process imports `tree`'s packages
    try:
        worker = EngineWorker.start(engine_args(max_model_len_tokens))
    finally:
        os.environ.pop("PYTHONPATH")
    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=victim, args=(worker.base_url, stop, out))
    windows: list[tuple[str, float, float, int]] = []
    try:
        proc.start()
        time.sleep(1.0)  # the victim's baseline, and its first requests warm up
        with httpx.Client(timeout=120) as client:
            for _ in range(reps):
                for family, raw in attacks.items():
                    time.sleep(GAP_S)
                    start = time.monotonic()
                    status = client.post(f"{worker.base_url}/completions", content=raw,
                                         headers={"content-type": "application/json"}
                                         ).status_code
                    windows.append((family, start, time.monotonic(), status))
        time.sleep(GAP_S)
    finally:
        stop.set()
        samples = []
        while (item := out.get(timeout=120)) is not None:
            samples.append(item)
        proc.join(30)
        worker.stop()
    return summarize(samples, windows)


def summarize(samples: list[tuple[float, float | None]],
              windows: list[tuple[str, float, float, int]]) -> dict:
    def overlaps(sent: float, first: float, w: tuple) -> bool:
        return sent <= w[2] and first >= w[1]
    served = [(s, f) for s, f in samples if f is not None]
    outside = [f - s for s, f in served if not any(overlaps(s, f, w) for w in windows)]
    stalls: dict[str, list[float]] = {}
    statuses: dict[str, list[int]] = {}
    for w in windows:
        hit = [f - s for s, f in served if overlaps(s, f, w)]
        stalls.setdefault(w[0], []).append(max(hit) if hit else 0.0)
        statuses.setdefault(w[0], []).append(w[3])
    return {"baseline_ttft_p50_ms": round(1e3 * statistics.median(outside), 2),
            "victim_requests": len(samples), "victim_failed": len(samples) - len(served),
            "stall_ms": {k: [round(1e3 * v, 1) for v in vs] for k, vs in stalls.items()},
            "statuses": statuses}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", default=DEFAULT_BEFORE, help="the git revision to compare")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=3, help="each body, per run")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="the engine's context in tokens (default: the tiny model's 2,048)")
    args = p.parse_args(argv)
    attacks = bodies(args.max_model_len or TINY_MAX_POSITION_EMBEDDINGS)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="kvroute-before-") as tmp:
        trees = {"before": source_tree(args.before, Path(tmp)), "after": ROOT}
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                run = one_run(tree, attacks, args.reps, args.max_model_len)
                runs[name].append(run)
                print(f"round {round_} {name}: baseline p50 {run['baseline_ttft_p50_ms']} ms, "
                      f"stalls {run['stall_ms']}", flush=True)
    out: dict = {"before_rev": args.before, "rounds": args.rounds, "reps": args.reps,
                 "max_model_len_tokens": args.max_model_len or TINY_MAX_POSITION_EMBEDDINGS}
    for name, rs in runs.items():
        out[name] = {
            "baseline_ttft_p50_ms": [r["baseline_ttft_p50_ms"] for r in rs],
            "victim_failed": sum(r["victim_failed"] for r in rs),
            "stall_ms_median": {f: round(statistics.median(
                v for r in rs for v in r["stall_ms"][f]), 1) for f in attacks},
            "statuses": {f: sorted({s for r in rs for s in r["statuses"][f]})
                         for f in attacks}}
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
