"""The built-in smollm2 (SmolLM2-135M-Instruct, a Q4_1 GGUF) measured on this CPU, in one run.

    flock /tmp/kvroute-heavy.lock .venv/bin/python benchmarks/bench_real_model.py

- first_start_s, paris, ready_s: `kvroute serve` with no --model (2 replicas) from an empty
  kvroute cache (the GGUF conversion included) until both replicas are ready; asked "What
  is the capital of France?" through the `openai` client's chat endpoint, greedily; then
  started again on the converted cache (--ready-runs times: ready_s is their median,
  ready_cpu_s the CPU seconds its processes had used once ready, ready_phases the phases
  kvroute serve printed on the last one). Alternated with those: --no-bytecode-runs starts
  where Python finds no bytecode (ready_no_bytecode_*), and --floor-runs starts of Ray
  Serve alone with kvroute's settings and a trivial 2-replica app (floor_*,
  benchmarks/serve_floor.py). `--skip first` times only the later starts (the cache
  converted first, untimed).
- greedy_match: the fraction of the test prompts (tests/worker/model/gguf/smollm2_oracle.py, 27 to
  1,180 tokens) whose greedy tokens through the engine equal transformers' reading of the
  same GGUF file (fp32).
- ttft_cached_over_cold: the engine's time to first token on a ~2,000-token chat prompt
  once it is cached over its cold TTFT (medians).
- engine_decode_vs_hf: the engine's decode tokens/s over transformers' `generate` (sdpa), one
  sequence, the same model, process and torch threads: the median of --decode-rounds ratios,
  each of an engine run and an HF run timed one after the other (one run each moved the
  ratio from 1.0 to 2.3 between two loads).
- e2e_throughput_ratio, e2e_ttft_p50_ratio: 2 replicas of `kvroute serve --model smollm2`,
  cache_aware over round_robin, on shared-prefix chat traffic (groups of questions under
  1,000+-token system prompts; benchmarks/simlib/chat_load.py), each on a fresh server.

Prints what it measured and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_e2e import Server, free_port, per_replica, warm_up  # noqa: E402
from benchmarks.serve_start import time_start, wait_until  # noqa: E402
from benchmarks.simlib.chat_load import chat_requests, run_chat_load  # noqa: E402
from benchmarks.simlib.openai_load import summarize_http  # noqa: E402
from kv.hashing import DEFAULT_BLOCK_SIZE  # noqa: E402

QUESTION = "What is the capital of France?"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--per-group", type=int, default=6)
    p.add_argument("--system-sections", type=int, default=24, help="~45 tokens each")
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--max-concurrency", type=int, default=8)
    p.add_argument("--num-blocks", type=int, default=416,
                   help="KV blocks per replica: about half the groups' system prompts + 128")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--decode-rounds", type=int, default=3,
                   help="engine and HF decode timed alternately this many times (medians)")
    p.add_argument("--ready-runs", type=int, default=1,
                   help="later starts of kvroute serve timed; ready_s is their median")
    p.add_argument("--no-bytecode-runs", type=int, default=0,
                   help="later starts timed as well with no Python bytecode to read (every "
                        "process compiles its imports, as in a venv installed without it)")
    p.add_argument("--floor-runs", type=int, default=0,
                   help="starts of Ray Serve alone with kvroute's settings and a trivial "
                        "2-replica app (benchmarks/serve_floor.py), alternated with those")
    p.add_argument("--skip", default="",
                   help="comma list of parts to skip: first,ready,engine,e2e (serve: both "
                        "first and ready)")
    return p.parse_args(argv)


def two_replicas_ready(base_url: str) -> Callable[[], bool]:
    return lambda: len(httpx.get(f"{base_url}/ready", timeout=5).json().get("replicas",
                                                                              [])) == 2


def answers_ok(base_url: str) -> Callable[[], bool]:
    return lambda: httpx.get(base_url, timeout=5).text == "ok"


def start_default(cache_dir: Path, log_path: Path, env: dict[str, str] | None = None
                  ) -> tuple[Server, float]:
    """`kvroute serve` with no --model on `cache_dir` (and `env`); (server, seconds until
    ready)."""
    server = Server.__new__(Server)
    server.port = free_port()
    server.base_url = f"http://127.0.0.1:{server.port}"
    server._log = open(log_path, "w")
    start = time.perf_counter()
    server.proc = subprocess.Popen(
        [str(ROOT / ".venv/bin/kvroute"), "serve", "--port", str(server.port)],
        stdout=server._log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
        env={**os.environ, **(env or {}), "KVROUTE_CACHE_DIR": str(cache_dir)})
    try:
        wait_until(server.proc, two_replicas_ready(server.base_url))
    except RuntimeError:
        server.stop()
        raise
    return server, time.perf_counter() - start


def measure_first(workdir: Path) -> dict:
    """The first start, converting the GGUF into an empty cache, and the capital of France."""
    import openai

    server, first_start_s = start_default(workdir / "kvroute-cache",
                                          workdir / "serve-first.log")
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=120)
        reply = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": QUESTION}],
            temperature=0, max_tokens=32)
        answer = reply.choices[0].message.content or ""
        print(f"chat completion: {reply.model_dump_json(exclude_none=True)}")
    finally:
        server.stop()
    print(f"kvroute serve (no --model): first start {first_start_s:.1f} s (conversion "
          f"included); {QUESTION!r} -> {answer!r}")
    return {"paris": "Paris" in answer, "answer": answer,
            "first_start_s": round(first_start_s, 1)}


def measure_starts(workdir: Path, args: argparse.Namespace) -> dict:
    """Later starts of `kvroute serve` (the converted GGUF in the cache already), alternated
    so each kind sees the same load on a shared box: `ready` as installed, `ready_no_bytecode`
    with Python finding no bytecode (it looks for .pyc files only in an empty directory and
    writes none, as in a venv installed without it on a host that does not write it: every
    process compiles what it imports), and `floor`, Ray Serve's own start with kvroute's
    settings and a trivial 2-replica app (benchmarks/serve_floor.py). Medians, each run,
    and the last run's phases."""
    if not (workdir / "kvroute-cache").is_dir():  # no first start: convert here, untimed
        os.environ["KVROUTE_CACHE_DIR"] = str(workdir / "kvroute-cache")
        from worker.tokenizer.files import checkpoint_dir

        checkpoint_dir("smollm2")
        checkpoint_dir("smollm2", weights=False)
    no_bytecode = {"PYTHONPYCACHEPREFIX": str(workdir / "no-bytecode"),
                   "PYTHONDONTWRITEBYTECODE": "1"}
    kinds = {"ready": (args.ready_runs, "serve", {}),
             "ready_no_bytecode": (args.no_bytecode_runs, "serve", no_bytecode),
             "floor": (args.floor_runs, "floor", {})}
    runs_of: dict[str, list[dict]] = {kind: [] for kind in kinds}
    failures: dict[str, int] = {}
    for run in range(max(runs for runs, _, _ in kinds.values())):
        for kind, (runs, what, env) in kinds.items():
            if run >= runs:
                continue
            port = free_port()
            base_url = f"http://127.0.0.1:{port}"
            if what == "serve":
                cmd = [str(ROOT / ".venv/bin/kvroute"), "serve", "--port", str(port)]
                ready = two_replicas_ready(base_url)
            else:
                cmd = [sys.executable, str(ROOT / "benchmarks/serve_floor.py"), "--port",
                       str(port)]
                ready = answers_ok(base_url)
            log_path = workdir / f"{kind}-{run}.log"
            try:
                measured = time_start(cmd, {**env, "KVROUTE_CACHE_DIR": str(
                    workdir / "kvroute-cache")}, log_path, ready)
            except RuntimeError as err:  # counted and shown, the other runs go on
                tail = log_path.read_text(errors="replace").splitlines()[-3:]
                print(f"{kind}: failed ({err}); its log ends: {tail}", flush=True)
                failures[kind] = failures.get(kind, 0) + 1
                continue
            runs_of[kind].append(measured)
            print(f"{kind}: ready in {measured['s']:.1f} s, its processes using "
                  f"{measured['cpu_s']:.1f} CPU s ({json.dumps(measured['cpu_by_process'])}); "
                  f"phases {json.dumps(measured['phases'])}; replicas "
                  f"{json.dumps(measured['replicas'])}", flush=True)
    out: dict = {f"{kind}_failed_starts": n for kind, n in failures.items()}
    for kind, measured in runs_of.items():
        if measured:
            out |= {f"{kind}_s": statistics.median(m["s"] for m in measured),
                    f"{kind}_runs_s": [m["s"] for m in measured],
                    f"{kind}_cpu_s": statistics.median(m["cpu_s"] for m in measured),
                    f"{kind}_phases": measured[-1]["phases"]}
    return out


async def _engine_run(engine, request_id: str, token_ids: list[int], max_tokens: int,
                      ignore_eos: bool = False) -> tuple[list[int], float, float]:
    """(tokens, TTFT s, total s) of one greedy request."""
    from protocol.engine import EngineRequest, SamplingParams

    start, first, tokens = time.perf_counter(), None, []
    async for delta in engine.generate(EngineRequest(request_id, token_ids, SamplingParams(
            max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos))):
        first = first or time.perf_counter() - start
        tokens += delta.token_ids
    return tokens, first, time.perf_counter() - start


def hf_decode_tok_s(hf, token_ids: list[int], num_tokens: int) -> float:
    """transformers' generate: decode tokens/s after the first token, one sequence."""
    import torch

    ids = torch.tensor([token_ids])

    def seconds(new_tokens: int) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                        do_sample=False, top_p=None, top_k=None, temperature=None,
                        attention_mask=torch.ones_like(ids))
        return time.perf_counter() - start

    seconds(2)  # warm-up
    return num_tokens / (seconds(num_tokens + 1) - seconds(1))


def measure_engine(args: argparse.Namespace) -> dict:
    import torch

    from tests.worker.model.gguf import smollm2_oracle as oracle
    from worker.engine.config import EngineConfig
    from worker.engine.factory import build_engine

    engine = build_engine(EngineConfig(model="smollm2", num_blocks=1024))
    hf = oracle.load_hf_model()  # eager attention, as the tests compare
    prompts = [oracle.chat_ids(m) for m in oracle.CHATS]
    run = asyncio.new_event_loop().run_until_complete
    matches = [run(_engine_run(engine, f"g{i}", p, 12))[0] == oracle.hf_greedy(hf, p, 12)
               for i, p in enumerate(prompts)]
    long_doc = oracle.long_document(45)
    cold, cached = [], []
    for k in range(2):  # each variant cold once, then cached
        ids = oracle.chat_ids([{"role": "system", "content": f"Variant {k}.\n{long_doc}"},
                               {"role": "user", "content": "Summarise the records."}])
        cold.append(run(_engine_run(engine, f"cold{k}", ids, 1))[1])
        cached.append(run(_engine_run(engine, f"cached{k}", ids, 1))[1])
    short = oracle.chat_ids([{"role": "user", "content": "Tell me a long story."}])
    n = args.decode_tokens
    hf.set_attn_implementation("sdpa")  # transformers' default, its faster path
    engine_runs, hf_runs = [], []
    for r in range(args.decode_rounds):  # alternated: a load change hits both sides alike
        _, ttft, total = run(_engine_run(engine, f"decode{r}", short, n + 1, ignore_eos=True))
        engine_runs.append(n / (total - ttft))
        hf_runs.append(hf_decode_tok_s(hf, short, n))
    engine_tok_s, hf_tok_s = statistics.median(engine_runs), statistics.median(hf_runs)
    ratios = [e / h for e, h in zip(engine_runs, hf_runs)]
    run(engine.shutdown())
    del hf, engine
    gc.collect()
    cold_s, cached_s = statistics.median(cold), statistics.median(cached)
    print(f"engine vs transformers: greedy {sum(matches)}/{len(matches)} prompts equal; "
          f"TTFT on {len(ids)} tokens cold {cold_s:.2f} s, cached {cached_s:.3f} s; decode "
          f"{engine_tok_s:.1f} tok/s vs HF generate {hf_tok_s:.1f} tok/s, medians of "
          f"{len(ratios)} alternated rounds (ratios {', '.join(f'{x:.2f}' for x in ratios)}; "
          f"{torch.get_num_threads()} torch threads)")
    return {"greedy_match": round(sum(matches) / len(matches), 3),
            "ttft_prompt_tokens": len(ids), "ttft_cold_s": round(cold_s, 3),
            "ttft_cached_s": round(cached_s, 3),
            "ttft_cached_over_cold": round(cached_s / cold_s, 3),
            "engine_decode_tok_s": round(engine_tok_s, 1), "hf_decode_tok_s": round(hf_tok_s, 1),
            "engine_decode_vs_hf": round(statistics.median(ratios), 3),
            "engine_decode_vs_hf_rounds": [round(x, 3) for x in ratios]}


def run_policy(policy: str, args: argparse.Namespace, workdir: Path) -> dict:
    settings = SimpleNamespace(block_size=DEFAULT_BLOCK_SIZE, pending_ttl_s=None, load_weight=0.1)
    server = Server(Path("smollm2"), policy, args.num_blocks, settings,
                    workdir / f"serve-{policy}.log")
    try:
        server.wait_ready()
        warm_up(server.base_url, "smollm2")
        requests = chat_requests(args.groups, args.per_group, args.system_sections, seed=0)
        records = asyncio.run(run_chat_load(server.base_url, "smollm2", requests,
                                            args.output_len, args.max_concurrency))
        summary = summarize_http(records)
        summary["per_replica"] = per_replica(server.base_url)
    finally:
        server.stop()
    if summary["num_errors"]:
        raise RuntimeError(f"{policy}: {summary['num_errors']} failed: {summary['first_error']}")
    print(f"{policy:<12} ok {summary['num_ok']}  TTFT p50 {summary['ttft_p50_s']:.2f} s  "
          f"p90 {summary['ttft_p90_s']:.2f} s  {summary['throughput_tok_s']:.1f} out tok/s  "
          f"hit rate {summary['cached_token_rate']:.3f}  prompt tokens "
          f"{summary['prompt_tokens']}  per replica {json.dumps(summary['per_replica'])}")
    return summary


def measure_e2e(args: argparse.Namespace, workdir: Path) -> dict:
    ca = run_policy("cache_aware", args, workdir)
    rr = run_policy("round_robin", args, workdir)
    return {"e2e_throughput_ratio": round(ca["throughput_tok_s"] / rr["throughput_tok_s"], 3),
            "e2e_ttft_p50_ratio": round(ca["ttft_p50_s"] / rr["ttft_p50_s"], 3),
            "e2e_cache_aware_hit_rate": round(ca["cached_token_rate"], 3),
            "e2e_round_robin_hit_rate": round(rr["cached_token_rate"], 3)}


def private_ingress_ports() -> None:
    """Ports of our own for every server started here: Ray Serve's defaults are fixed (the
    replicas' own HTTP and gRPC ports from 30000 and 40000, HAProxy's fallback proxy on 8500),
    and another instance on this host holding them answers our requests (HAProxy sends a
    request to the fallback until its health checks mark the replicas up)."""
    import random

    base = random.Random().randrange(0, 80) * 100
    for kind, start in (("HTTP", 31000), ("GRPC", 41000)):
        os.environ[f"RAY_SERVE_DIRECT_INGRESS_MIN_{kind}_PORT"] = str(start + base)
        os.environ[f"RAY_SERVE_DIRECT_INGRESS_MAX_{kind}_PORT"] = str(start + base + 100)
    os.environ["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"] = str(free_port())
    os.environ["RAY_SERVE_FALLBACK_PROXY_GRPC_PORT"] = str(free_port())


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    private_ingress_ports()
    skip = set(filter(None, args.skip.split(",")))
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="kvroute-bench-real-") as tmp:
        try:
            if not skip & {"serve", "first"}:
                out.update(measure_first(Path(tmp)))
            if not skip & {"serve", "ready"}:
                out.update(measure_starts(Path(tmp), args))
            if "engine" not in skip:
                out.update(measure_engine(args))
            if "e2e" not in skip:
                out.update(measure_e2e(args, Path(tmp)))
        except Exception:
            for log in sorted(Path(tmp).glob("*.log")):  # the servers' side of a failure
                print(f"--- {log.name} (last lines)\n" + "\n".join(
                    log.read_text(errors="replace").splitlines()[-40:]), file=sys.stderr)
            raise
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
