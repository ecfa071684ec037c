"""One tenant must not hurt another: a hostile tenant against a victim tenant on every front.

    python benchmarks/bench_hostile.py [--fronts direct,engine,workers] [--fuzz-cases 1000]

Starts each front for real, one after the other (benchmarks/hostile/fronts.py): `kvroute
serve --engine sim` with direct ingress (2 replicas), one `kvroute engine --engine sim`, and
`kvroute serve --workers` in front of two `kvroute engine --engine sim` workers publishing
KV events; simulated tiny-preset engines, loopback only. On each: the victim streams
completions that share a cached prefix, alone (its baseline), then while the hostile tenant
sends, one at a time, every request of benchmarks/hostile/attacks.py (numeric extremes in
every field, huge and out-of-range lists, 8 MB texts, unknown paths, requests abandoned at
every stage), the pin quota race (direct), a lying worker with huge KV event batches
(workers), then --fuzz-cases schemathesis cases (benchmarks/hostile/fuzz.py).

The last line is a JSON object: victim_failed, victim_ttft_p50_over_baseline (the worst
front's attack p50 over its own baseline), victim_off_cache (victim requests that missed
their cached prefix), load_nonfinite (non-finite values of kvroute_router_load_tokens
seen), load_leaked_after_s (worst front: seconds after the attack until nothing is
outstanding and the load decays as designed; null: not within --settle-timeout-s),
engine_step_failures, fuzz_cases, fuzz_5xx, then per front: everything measured, and the
attacks that overlapped a victim request that failed or was slow (hurt_by).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.hostile.attacks import all_attacks  # noqa: E402
from benchmarks.hostile.fronts import FRONTS  # noqa: E402
from benchmarks.hostile.run import HostileConfig, run_front  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fronts", default="direct,engine,workers")
    p.add_argument("--fuzz-cases", type=int, default=1000, help="per front")
    p.add_argument("--baseline-s", type=float, default=8.0)
    p.add_argument("--settle-timeout-s", type=float, default=60.0)
    p.add_argument("--no-attacks", action="store_true", help="fuzz only")
    return p.parse_args(argv)


def summarize(per_front: list[dict], runtime_s: float) -> dict:
    leaks = [f["load_leaked_after_s"] for f in per_front if f["routed"]]
    ratios = [f["victim_ttft_p50_over_baseline"] for f in per_front
              if f["victim_ttft_p50_over_baseline"] is not None]
    return {
        "victim_failed": sum(f["victim_failed"] for f in per_front),
        "victim_ttft_p50_over_baseline": max(ratios) if ratios else None,
        "victim_off_cache": sum(f["victim_off_cache"] for f in per_front),
        "load_nonfinite": sum(f["load_nonfinite"] for f in per_front),
        "load_leaked_after_s": None if None in leaks else max(leaks, default=0.0),
        "engine_step_failures": sum(f["engine_step_failures"] for f in per_front),
        "fuzz_cases": sum(f["fuzz"]["cases"] for f in per_front),
        "fuzz_5xx": sum(f["fuzz"]["5xx"] for f in per_front),
        "runtime_s": round(runtime_s, 1), "load_avg_1m": round(os.getloadavg()[0], 2),
        "fronts": {f["front"]: f for f in per_front},
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    config = HostileConfig(baseline_s=args.baseline_s, fuzz_cases=args.fuzz_cases,
                           settle_timeout_s=args.settle_timeout_s,
                           attacks=() if args.no_attacks else tuple(all_attacks()),
                           multi_request=not args.no_attacks)
    start = time.monotonic()
    per_front = []
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        for name in args.fronts.split(","):
            t0 = time.monotonic()
            with FRONTS[name](Path(tmp)) as front:
                print(f"{time.monotonic() - start:6.1f}s {name} front up", flush=True)
                result = run_front(front, config)
            result["front_s"] = round(time.monotonic() - t0, 1)
            print(json.dumps(result), flush=True)
            per_front.append(result)
    out = summarize(per_front, time.monotonic() - start)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
