"""The simulator's workloads against any OpenAI-compatible endpoint, over HTTP.

    kvroute serve --engine sim --replicas 2 --num-blocks 4096 &
    python benchmarks/bench_serving.py --base-url http://127.0.0.1:8000 --model tiny \\
        --workload generated_shared_prefix --set num_groups=8 --set prompts_per_group=8

Open-loop: requests leave at the workload's arrival times (--qps, or mooncake's trace times
over --time-scale), streamed (SSE). Prompts are token id lists by default (--prompt-format
text sends one character per id). Prints TTFT, TPOT, output throughput and the server's
cached_tokens (usage.prompt_tokens_details) over prompt tokens, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simlib import workloads as wl  # noqa: E402
from benchmarks.simlib.experiment import MOONCAKE_TRACE  # noqa: E402
from benchmarks.simlib.openai_load import LoadConfig, LoadGenerator, summarize_http  # noqa
from benchmarks.simlib.prompts import TokenSource  # noqa: E402

GENERATORS = {"generated_shared_prefix": wl.generated_shared_prefix,
              "shared_prefix": wl.shared_prefix, "multi_turn": wl.multi_turn,
              "prefix_repetition": wl.prefix_repetition}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="tiny")
    p.add_argument("--workload", required=True, choices=wl.WORKLOAD_NAMES)
    p.add_argument("--qps", type=float, default=None,
                   help="total request rate (inf: all at once); default: the generator's")
    p.add_argument("--time-scale", type=float, default=1.0, help="mooncake: trace speed-up")
    p.add_argument("--trace", type=Path, default=MOONCAKE_TRACE)
    p.add_argument("--max-requests", type=int, default=None, help="send the first N only")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a generator argument, e.g. num_groups=8 (repeatable)")
    p.add_argument("--prompt-format", choices=("ids", "text"), default="ids")
    p.add_argument("--token-range", default="32,127",
                   help="prompt token ids in [LOW, HIGH) (default: printable ASCII, which "
                        "kvroute's byte-level tiny model reads as text too)")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the summary JSON here")
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> wl.Workload:
    kw: dict = {}
    for pair in args.set:
        name, _, value = pair.partition("=")
        kw[name] = float(value) if "." in value or value == "inf" else int(value)
    if args.workload == "mooncake":
        w = wl.mooncake(args.trace, time_scale=args.time_scale, max_requests=args.max_requests)
    else:
        if args.qps is not None:
            kw["rate_qps"] = args.qps
        w = GENERATORS[args.workload](seed=args.seed, **kw)
    if args.max_requests is not None and args.workload != "mooncake":
        keep = {it.request_id for it in w.items[: args.max_requests]}
        w = wl.Workload(w.name, tuple(it for it in w.items if it.request_id in keep
                                      and (it.parent_id is None or it.parent_id in keep)))
    return w


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    workload = build(args)
    low, high = (int(x) for x in args.token_range.split(","))
    tokens = TokenSource(args.seed, low, high, workload.shared_keys())
    config = LoadConfig(args.base_url, args.model, args.prompt_format, args.max_concurrency,
                        args.api_key)
    records = asyncio.run(LoadGenerator(config, workload, tokens).run())
    out = {"workload": workload.name, "base_url": args.base_url,
           "prompt_format": args.prompt_format, **summarize_http(records)}
    print(f"{workload.name} -> {args.base_url}: {out['num_ok']}/{out['num_requests']} ok")
    for key in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "throughput_tok_s",
                "cached_token_rate"):
        print(f"  {key:<18} {out[key]:.4f}")
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v)
                      for k, v in out.items()}))
    return out


if __name__ == "__main__":
    main()
