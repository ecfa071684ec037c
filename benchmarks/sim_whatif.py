"""What-ifs for the router's cost model: cache_aware and approximate mode under several
RouterConfig variants on chosen rungs, one table (benchmarks/NOTEBOOK.md).

    python benchmarks/sim_whatif.py --rung shared_prefix=1.5 --rung burst=inf \
        --variant base: --variant cached0.1:cached_load_fraction=0.1

A variant is LABEL:NAME=VALUE,NAME=VALUE: RouterConfig fields (the product's settings) and
the what-ifs kept out of the product (benchmarks/simlib/whatifs.py `WhatIfs`: e.g.
`recent_prefill_fraction=0.25`, `first_token_signal=true`). Rates are per replica, as in the ladders
(mooncake: time scale); `--num-blocks` replaces each workload's device capacity (approximate
mode's history gets the same). Simulated figures only: deterministic, any --jobs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simlib import experiment as ex  # noqa: E402
from benchmarks.simlib.cluster import ClusterConfig  # noqa: E402
from benchmarks.simlib.replica import ReplicaConfig  # noqa: E402
from benchmarks.simlib.whatifs import WhatIfs  # noqa: E402
from router.core.config import RouterConfig  # noqa: E402


def parse_value(text: str) -> bool | int | float | str:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_variant(text: str) -> tuple[str, dict, WhatIfs]:
    """(label, RouterConfig keywords, what-ifs) of `--variant LABEL:NAME=VALUE,...`."""
    label, _, rest = text.partition(":")
    kw = {k: parse_value(v) for k, _, v in (p.partition("=") for p in rest.split(",") if p)}
    fields = {f.name for f in dataclasses.fields(RouterConfig)}
    whatif_fields = {f.name for f in dataclasses.fields(WhatIfs)}
    if not label or not set(kw) <= fields | whatif_fields:
        raise SystemExit(f"--variant {text!r}: want LABEL:NAME=VALUE,... with RouterConfig "
                         f"fields ({', '.join(sorted(fields))}) or what-ifs "
                         f"({', '.join(sorted(whatif_fields))})")
    whatifs = WhatIfs(**{k: v for k, v in kw.items() if k in whatif_fields})
    return label, {k: v for k, v in kw.items() if k in fields}, whatifs


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rung", action="append", required=True, metavar="WORKLOAD=RATE")
    p.add_argument("--variant", action="append", required=True, metavar="LABEL:SETTINGS")
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--num-blocks", type=int, default=None,
                   help="device blocks per replica (default: each workload's own)")
    p.add_argument("--seed", type=int, default=0, help="the workloads' seed (arrivals, order)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    tasks, keys = [], []
    for rung in args.rung:
        name, _, rate = rung.partition("=")
        num_blocks = args.num_blocks or ex.DEFAULTS[name].num_blocks
        replica = ReplicaConfig(num_blocks=num_blocks)
        for label, kw, whatifs in variants:
            for contender, approximate in (("cache_aware", False), ("approximate", True)):
                router = RouterConfig(approximate=approximate,
                                      approx_capacity_blocks=num_blocks, **kw)
                tasks.append(ex.Task(
                    ClusterConfig(args.replicas, replica, router, whatifs=whatifs),
                    ex.WorkloadSpec(name, float(rate), args.replicas, args.seed), contender))
                keys.append((name, rate, label))
    rows = []
    print(f"{'workload':<24}{'rate':>6} {'variant':<22}{'contender':<12}{'hit':>7}"
          f"{'hit/bnd':>8}{'ttft90':>8}{'share':>7}{'minreq':>7}")
    for (name, rate, label), s in zip(keys, ex.run_all(tasks, args.jobs), strict=True):
        row = dict(workload=name, rate=rate, variant=label, **s.as_dict())
        rows.append(row)
        print(f"{name:<24}{rate:>6} {label:<22}{s.label:<12}{s.hit_rate:>7.3f}"
              f"{s.hit_rate_over_bound:>8.3f}{s.ttft_p90_s:>8.3f}{s.load_share:>7.3f}"
              f"{s.min_request_share:>7.2f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
