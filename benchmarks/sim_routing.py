"""Routing at scale, simulated: the real router, scheduler and KV code on a virtual clock.

    python benchmarks/sim_routing.py --workload generated_shared_prefix --replicas 8
    python benchmarks/sim_routing.py --workload shared_prefix --replicas 8 --ladder
    python benchmarks/sim_routing.py --workload mooncake --replicas 8 --time-scale 4
    python benchmarks/sim_routing.py --workload shared_prefix --replicas 8 --ladder \
        --gateways 1,2,8 --share-pending-delay-s 0.005

Runs the policy under test (--policy, default cache_aware) and, in the same invocation, the
round_robin and approximate (cache_aware without events) baselines, plus any --others.
Prints a table per rate and, last, one JSON line: the policy's numbers and its ratios to
the baselines (in a ladder, at the lowest rate where round_robin is saturated: its
throughput grows less than 5% over the previous rate), and the worst of every rung against
approximate mode and the pooled bound (benchmarks/simlib/targets.py). `--router NAME=VALUE`
sets a RouterConfig field for a what-if. With --ladder it also writes
TTFT-vs-QPS plots (PNG) and all summaries (JSON) to --out-dir.
With --gateways, the policy runs behind each number of gateways (routers with their own
marks, load and history) instead of against approximate mode, and the JSON line adds what
G gateways lose against one (benchmarks/simlib/gateway_ladder.py).
Definitions: benchmarks/simlib/report.py and benchmarks/NOTEBOOK.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simlib import experiment as ex  # noqa: E402
from benchmarks.simlib.cluster import MAX_TOKENS_SENT, ClusterConfig  # noqa: E402
from benchmarks.simlib.gateway_ladder import (  # noqa: E402
    gateway_contenders,
    gateway_figures,
    gateway_table,
)
from benchmarks.simlib.gateways import SPREADS  # noqa: E402
from benchmarks.simlib.replica import ReplicaConfig  # noqa: E402
from benchmarks.simlib.report import Summary, table  # noqa: E402
from benchmarks.simlib.targets import ladder_figures  # noqa: E402
from benchmarks.simlib.whatifs import WhatIfs  # noqa: E402
from benchmarks.simlib.workloads import WORKLOAD_NAMES  # noqa: E402
from kv.hashing import DEFAULT_BLOCK_SIZE  # noqa: E402
from router.core.config import RouterConfig  # noqa: E402
from router.core.policies import POLICY_NAMES  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, choices=WORKLOAD_NAMES)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--policy", default="cache_aware", choices=POLICY_NAMES)
    p.add_argument("--policy-only", action="store_true",
                   help="run the policy alone: no round_robin or approximate baseline (no "
                        "ratios, no saturation rate), a third of the time")
    p.add_argument("--others", default="",
                   help="more policies to compare, comma-separated, or 'all'")
    p.add_argument("--qps", type=float, default=None,
                   help="total request rate (inf: all at once); default: the workload's")
    p.add_argument("--time-scale", type=float, default=None,
                   help="mooncake: speed-up of the trace's arrivals (default: replicas / 8, "
                        "the published trace being the load of 8 replicas)")
    p.add_argument("--ladder", nargs="?", const="default", default=None,
                   help="run a rate ladder: comma-separated total QPS (mooncake: time "
                        "scales); no value: the workload's default ladder")
    p.add_argument("--num-blocks", type=int, default=None, help="device KV blocks a replica")
    p.add_argument("--host-blocks", type=int, default=0, help="host tier blocks a replica")
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--preset", default="h100-llama3-8b")
    p.add_argument("--event-delay-s", type=float, default=0.01)
    p.add_argument("--publish-interval-s", type=float, default=0.05)
    p.add_argument("--load-weight", type=float, default=None)
    p.add_argument("--imbalance-threshold", type=float, default=None)
    p.add_argument("--pending-ttl-s", type=float, default=None)
    p.add_argument("--router", action="append", default=[], metavar="NAME=VALUE",
                   help="set a RouterConfig field, or a what-if kept out of the product "
                        "(benchmarks/simlib/whatifs.py), for every contender (repeatable)")
    p.add_argument("--first-token-signal", action="store_true",
                   help="what-if: the router hears each request's first token "
                        "(--router first_token_signal=true)")
    p.add_argument("--gateways", default=None,
                   help="comma-separated gateway counts (e.g. 1,2,8): the policy behind each, "
                        "with round_robin as the baseline")
    p.add_argument("--spread", default="round_robin",
                   help=f"with --gateways: how requests reach them, comma-separated, of "
                        f"{', '.join(SPREADS)}")
    p.add_argument("--share-pending-delay-s", type=float, default=None,
                   help="with --gateways: also run the largest count with its routers sharing "
                        "pending marks, each reaching the others this much later")
    p.add_argument("--share-work", action="store_true",
                   help="with --share-pending-delay-s: also run the largest count with its "
                        "routers sharing routed work too (each router counts every request)")
    p.add_argument("--rotate-candidates", action="store_true",
                   help="with --gateways: each router lists the replicas from its own offset, "
                        "as live routers do (rank i of G from i x N / G): full ties fall on "
                        "different replicas at different routers")
    p.add_argument("--offset-by-id", action="store_true",
                   help="with --rotate-candidates: each router's offset is a hash of its id, "
                        "as a live router's before it knows its rank (two may share one)")
    p.add_argument("--shared-only", action="store_true",
                   help="with --share-pending-delay-s: of G > 1 run only the largest G sharing "
                        "the most (marks, and routed work with --share-work)")
    p.add_argument("--max-tokens-sent", default="workload_max", choices=MAX_TOKENS_SENT,
                   help="the max_tokens clients send: the workload's longest answer (a cap, "
                        "default), the context left after the prompt, or each request's "
                        "exact answer length (an oracle); the answers are the same")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    p.add_argument("--trace", type=Path, default=ex.MOONCAKE_TRACE)
    p.add_argument("--quick", action="store_true", help="a tiny workload, for smoke tests")
    p.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--tag", default="", help="suffix of the files written to --out-dir")
    args = p.parse_args(argv)
    if args.gateways is not None:
        try:
            args.gateways = sorted({int(g) for g in args.gateways.split(",")})
        except ValueError:
            p.error(f"--gateways {args.gateways!r}: want comma-separated integers")
        if 1 not in args.gateways or not all(1 <= g <= 64 for g in args.gateways):
            p.error("--gateways: counts in [1, 64], 1 among them (the reference)")
        args.spread = args.spread.split(",")
        if not set(args.spread) <= set(SPREADS):
            p.error(f"--spread: each of {', '.join(SPREADS)}")
        if args.policy_only:
            p.error("--policy-only runs one router: not with --gateways")
    elif args.share_pending_delay_s is not None or args.rotate_candidates:
        p.error("--share-pending-delay-s and --rotate-candidates need --gateways")
    if args.offset_by_id and not args.rotate_candidates:
        p.error("--offset-by-id needs --rotate-candidates")
    if args.shared_only and args.share_pending_delay_s is None:
        p.error("--shared-only needs --share-pending-delay-s")
    if args.share_work and args.share_pending_delay_s is None:
        p.error("--share-work needs --share-pending-delay-s (the sharing's delay)")
    return args


def _router_settings(args: argparse.Namespace) -> dict:
    """`--router NAME=VALUE` settings by name, RouterConfig's and the what-ifs' alike."""
    fields = {f.name: f.type for cls in (RouterConfig, WhatIfs) for f in dataclasses.fields(cls)}
    kw: dict = {}
    for setting in args.router:
        name, _, value = setting.partition("=")
        if name not in fields or not value:
            raise SystemExit(f"--router {setting!r}: want NAME=VALUE with NAME one of "
                             f"{', '.join(fields)}")
        kw[name] = json.loads(value.lower()) if value.lower() in ("true", "false") else (
            value if fields[name] == "str" else float(value) if "." in value or "inf" in value
            else int(value))
    return kw


def router_base(args: argparse.Namespace, num_blocks: int) -> RouterConfig:
    kw: dict = dict(block_size=args.block_size, seed=args.seed,
                    approx_capacity_blocks=num_blocks + args.host_blocks)
    for name in ("load_weight", "imbalance_threshold", "pending_ttl_s"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    fields = {f.name for f in dataclasses.fields(RouterConfig)}
    kw.update((k, v) for k, v in _router_settings(args).items() if k in fields)
    return RouterConfig(**kw)


def whatifs_of(args: argparse.Namespace) -> WhatIfs:
    """The what-ifs `--router` and `--first-token-signal` set (none by default)."""
    fields = {f.name for f in dataclasses.fields(WhatIfs)}
    kw = {k: v for k, v in _router_settings(args).items() if k in fields}
    if args.first_token_signal:
        kw["first_token_signal"] = True
    return WhatIfs(**kw)


def rates_per_replica(args: argparse.Namespace, d: ex.WorkloadDefaults) -> list[float]:
    """The per-replica rates (mooncake: time scales) to run, in increasing order."""
    n = args.replicas
    per_total = 8 / n if args.workload == "mooncake" else 1 / n  # a time scale is per 8
    if args.ladder is None:
        total = args.time_scale if args.workload == "mooncake" else args.qps
        return [total * per_total if total is not None else d.rate_per_replica]
    if args.ladder == "default":
        return list(d.ladder_per_replica)
    return sorted(float(v) * per_total for v in args.ladder.split(","))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    d = ex.DEFAULTS[args.workload]
    num_blocks = args.num_blocks or d.num_blocks
    replica = ReplicaConfig(num_blocks=num_blocks, num_host_blocks=args.host_blocks,
                            block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                            max_num_batched_tokens=args.max_num_batched_tokens,
                            preset=args.preset)
    others = tuple(POLICY_NAMES) if args.others == "all" else tuple(
        o for o in args.others.split(",") if o)
    base = router_base(args, num_blocks)
    whatifs = whatifs_of(args)
    if args.gateways is None:
        entrants = ex.contenders(args.policy, base, others)
        if args.policy_only:
            entrants = entrants[:1]
    else:
        entrants = gateway_contenders(args.policy, base, args.gateways, args.spread,
                                      args.share_pending_delay_s, args.share_work,
                                      args.rotate_candidates, args.shared_only,
                                      args.offset_by_id)
    t0, cpu0 = time.perf_counter(), time.process_time()
    by_label: dict[str, list[Summary]] = {c.label: [] for c in entrants}
    tasks = [ex.Task(ClusterConfig(args.replicas, replica, c.router, args.event_delay_s,
                                   args.publish_interval_s, seed=args.seed,
                                   whatifs=whatifs,
                                   num_routers=c.num_routers, router_spread=c.router_spread,
                                   share_pending_delay_s=c.share_pending_delay_s,
                                   share_work=c.share_work,
                                   rotate_candidates=c.rotate_candidates,
                                   offset_by_id=c.offset_by_id,
                                   max_tokens_sent=args.max_tokens_sent),
                     ex.WorkloadSpec(args.workload, per_replica, args.replicas, args.seed,
                                     args.quick, args.trace), c.label)
             for per_replica in rates_per_replica(args, d) for c in entrants]
    rows: list[Summary] = []
    for s in ex.run_all(tasks, args.jobs):
        by_label[s.label].append(s)
        rows.append(s)
        print(f"  {s.label} @ {s.rate_qps:.2f} req/s: {s.wall_s:.1f} s wall, {s.cpu_s:.1f} s "
              "CPU", file=sys.stderr)
        if len(rows) == len(entrants):
            print(f"\n{args.workload}, {args.replicas} replicas, {num_blocks} blocks each, "
                  f"{s.num_requests} requests at {s.rate_qps:.2f} req/s")
            print(table(rows), flush=True)
            rows = []

    at = len(by_label[args.policy]) - 1
    saturation_qps = None
    if args.ladder is not None:
        sat = ex.saturation_index([s.throughput_tok_s for s in by_label["round_robin"]]) \
            if "round_robin" in by_label else None
        if sat is not None:
            at, saturation_qps = sat, by_label["round_robin"][sat].rate_qps
    main_s = by_label[args.policy][at]
    out = dict(workload=args.workload, replicas=args.replicas, policy=args.policy,
               num_blocks=num_blocks, host_blocks=args.host_blocks, quick=args.quick,
               rate_qps=main_s.rate_qps, saturation_rate_qps=saturation_qps,
               hit_rate=main_s.hit_rate, pooled_bound_hit_rate=main_s.pooled_bound_hit_rate,
               hit_rate_over_bound=main_s.hit_rate_over_bound, load_share=main_s.load_share,
               ttft_p90_s=main_s.ttft_p90_s, throughput_tok_s=main_s.throughput_tok_s)
    out.update(ladder_figures(by_label[args.policy], by_label.get("approximate"),
                              saturation_qps))
    if args.gateways is not None:
        print(f"\n{args.workload}: hit rate and load share per rung and contender "
              f"(saturation at {saturation_qps} req/s)")
        print(gateway_table(by_label, [c.label for c in entrants]))
        out.update(gateway_figures(by_label, entrants, args.policy, saturation_qps))
    for c in entrants:
        base_label = c.label
        if base_label != args.policy and c.num_routers == 1:
            b = by_label[base_label][at]
            out[f"ttft_p90_ratio_vs_{base_label}"] = _ratio(main_s.ttft_p90_s, b.ttft_p90_s)
            out[f"throughput_ratio_vs_{base_label}"] = _ratio(main_s.throughput_tok_s,
                                                              b.throughput_tok_s)
    out["wall_s"] = time.perf_counter() - t0
    out["cpu_s"] = time.process_time() - cpu0 + sum(  # worker processes' CPU too
        s.cpu_s for v in by_label.values() for s in v) * (args.jobs > 1)
    if args.ladder is not None:
        from benchmarks.simlib.plots import plot_ladder  # matplotlib: only for ladders

        stem = f"{args.workload}_r{args.replicas}{args.tag}" + (
            f"_gw{'-'.join(map(str, args.gateways))}" if args.gateways else "")
        png = plot_ladder(by_label, f"{args.workload}: {args.replicas} replicas x "
                          f"{num_blocks} blocks, {args.preset}",
                          args.out_dir / f"{stem}.png", saturation_qps)
        dump = {"args": {k: str(v) for k, v in vars(args).items()}, "result": out,
                "runs": {k: [s.as_dict() for s in v] for k, v in by_label.items()}}
        (args.out_dir / f"{stem}.json").write_text(json.dumps(dump, indent=1) + "\n")
        out["plot"] = str(png)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                      for k, v in out.items()}))
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(b) else math.nan


if __name__ == "__main__":
    main()
