"""The online pooled bound (SHARDS) against the exact pooled LRU, its cost on the routing
path, and how many sampled accesses the hit-bound actor absorbs.

    python benchmarks/bench_loss_ladder.py [--rate 0.01] [--skip-actor] [--quick]

For each workload (generated_shared_prefix, shared_prefix, conversation, mooncake; 8
replicas, the simulator's defaults) one simulated run records the pooled LRU's accesses in
order (benchmarks/simlib/access_log.py). Replayed, they give the exact pooled hit ratio at
0.5x, 1x and 2x the fleet's device KV capacity, and the online estimate the live routers
and actor compute (router/core/hit_curve.py) from what they are sent: each routed prompt
(from the routers) and each finished sequence, prompt and generated blocks (from the engine
replicas), sampled at the rate the actor sets for the fleet's capacity (R x 2^k, at least R:
`sample_rate` in each row); `*_fixed_rate` beside it samples at R throughout, as before the
rate followed the capacity. `*_routers_only` leaves the finished sequences out, to show
what they are worth. `*_spread` repeats the estimate with 8 other 64-bit windows of the
same hashes as the sampling key: other samples of the same size, the luck in one sample.

- bound_abs_err_max: max |online - exact| at 1x over the workloads;
- curve_abs_err_max: the same at 0.5x and 2x;
- gateway_cost_us_p50: `AccessSampler.on_routed` per prompt over every workload's prompts
  (what a routing decision pays); sampling_off_path_cpu_us_per_prompt: the sampling `take`
  does in the router's background send task, CPU a prompt (each workload at its rate);
- actor_accesses_per_s: sampled lookups + touches the real Ray actor replays per second,
  batches sent as the routers send them (run under the heavy lock: it starts Ray);
- causes_sum_ok: the routers' miss causes (router/core/miss_causes.py) add up exactly to the
  uncached prompt tokens in every run (benchmarks/simlib/miss_classes.py's check).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simlib import experiment as ex  # noqa: E402
from benchmarks.simlib.access_log import Released, Served, exact_hit_ratio, record_run  # noqa: E402
from benchmarks.simlib.cluster import ClusterConfig  # noqa: E402
from benchmarks.simlib.prompts import PromptBuilder, TokenSource  # noqa: E402
from benchmarks.simlib.replica import ReplicaConfig  # noqa: E402
from kv.hashing import DEFAULT_BLOCK_SIZE, namespace_root  # noqa: E402
from router.core.access_sampler import AccessSampler, SamplerConfig  # noqa: E402
from router.core.config import RouterConfig  # noqa: E402
from router.core.hit_curve import HitCurveConfig, PooledHitCurve  # noqa: E402
from router.core.shards import sample_threshold  # noqa: E402

Estimate = tuple[dict[float, float], float]  # hit ratio at each multiple, the rate sampled at

WORKLOADS = ("generated_shared_prefix", "shared_prefix", "conversation", "mooncake")
MULTIPLES = (0.5, 1.0, 2.0)
NUM_REPLICAS = 8
BLOCK_SIZE = DEFAULT_BLOCK_SIZE


def online(log: list, config: HitCurveConfig, capacity_blocks: int, releases: bool = True,
           key_offset: int = 0) -> Estimate:
    """The online estimate at each multiple, and the rate it was sampled at (the actor's,
    for a fleet of `capacity_blocks`, known before the first prompt as the routers know
    it). `key_offset` k > 0: every hash rotated left k bytes first, so the sampling key is
    its 8 bytes from k (0: the live key)."""
    curve = PooledHitCurve(config, clock=lambda: 0.0)
    curve.set_capacity(capacity_blocks)
    rate = curve.sample_rate
    threshold = sample_threshold(rate)

    def sample(hashes):
        if key_offset:
            hashes = [h[key_offset:] + h[:key_offset] for h in hashes]
        return list(filter(threshold.__gt__, hashes))

    for op in log:
        if isinstance(op, Served):
            curve.add_prompts([sample(op.block_hashes)], rate, len(op.block_hashes),
                              op.num_prompt_tokens, BLOCK_SIZE)
        elif releases:
            curve.add_released([sample(op.block_hashes)], rate)
    assert curve.sample_rate == rate, "the rate moved with the capacity fixed"
    return {m: curve.hit_ratio(m * capacity_blocks, "all") for m in MULTIPLES}, rate


def gateway_cost_us(logs: list[tuple[list, float]]) -> tuple[float, float, float]:
    """One `on_routed` call over every routed prompt, p50 and p90 wall microseconds (the
    decision path), and the CPU microseconds a prompt of the sampling `take` does off it,
    each log sampled at its rate."""
    sampler = AccessSampler("bench", BLOCK_SIZE)
    clock = time.perf_counter_ns
    costs, take_ns = [], 0
    for log, rate in logs:
        sampler.take(None)
        sampler.set_sample_rate(rate)
        for op in log:
            if isinstance(op, Served):
                t0 = clock()
                sampler.on_routed(op.block_hashes, op.num_prompt_tokens)
                costs.append(clock() - t0)
                if len(costs) % 64 == 0:  # as the router's link takes them, twice a second
                    t0 = time.thread_time_ns()
                    sampler.take(None)
                    take_ns += time.thread_time_ns() - t0
    q = statistics.quantiles(costs, n=10)
    return statistics.median(costs) / 1e3, q[8] / 1e3, take_ns / len(costs) / 1e3


def mooncake_prompts(num_prompts: int) -> list[tuple[list[bytes], int]]:
    """The first Mooncake prompts' block hashes and lengths, built as the simulator builds
    them (no run needed)."""
    workload = ex.build_workload("mooncake", 1.0, NUM_REPLICAS, 0)
    source = TokenSource(0, 3, ReplicaConfig(num_blocks=1).vocab_size, workload.shared_keys())
    builder = PromptBuilder(source, BLOCK_SIZE, namespace_root(ClusterConfig.model_name))
    out = []
    for item in workload.items[:num_prompts]:
        token_ids, hashes = builder.build(item.segments, [], [])
        out.append((hashes, len(token_ids)))
    return out


def actor_accesses_per_s(num_prompts: int) -> tuple[float, int]:
    """Mooncake prompts sent whole (R = 1: every block a sampled access, with the trace's
    own reuse) in batches of 256 prompts to a real actor; sampled accesses replayed a
    second, from the first send to the last reply."""
    import ray

    from router.cluster.hit_bound import HitBoundActor

    prompts = mooncake_prompts(num_prompts)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             object_store_memory=128 * 1024**2, namespace="bench-loss-ladder")
    try:
        actor = HitBoundActor.remote(HitCurveConfig(sample_rate=1.0))
        batches, sampler = [], AccessSampler("bench", BLOCK_SIZE, SamplerConfig(sample_rate=1.0))
        for i, (hashes, num_tokens) in enumerate(prompts, 1):
            sampler.on_routed(hashes, num_tokens)
            if i % 256 == 0 or i == len(prompts):
                batches.append(sampler.take(25000))
        ray.get(actor.stats.remote())  # started
        t0 = time.perf_counter()
        ray.get([actor.record.remote(b) for b in batches])
        elapsed_s = time.perf_counter() - t0
        n = ray.get(actor.stats.remote())["num_sampled_accesses"]
        return n / elapsed_s, n
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=0.01, help="SHARDS sample rate R (the least)")
    p.add_argument("--skip-actor", action="store_true", help="no Ray: leave out the actor")
    p.add_argument("--actor-only", action="store_true",
                   help="only the actor (run it under the heavy lock: it starts Ray)")
    p.add_argument("--actor-prompts", type=int, default=600)
    p.add_argument("--no-spread", action="store_true", help="only the live sampling key")
    p.add_argument("--quick", action="store_true", help="smoke-test sizes only")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help="comma-separated, of " + ", ".join(WORKLOADS))
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    config = HitCurveConfig(sample_rate=args.rate)
    fixed = HitCurveConfig(sample_rate=args.rate, max_rate_doublings=0)
    rows, logs = {}, []
    for name in () if args.actor_only else args.workloads.split(","):
        d = ex.DEFAULTS[name]
        workload = ex.build_workload(name, d.rate_per_replica, NUM_REPLICAS, 0, quick=args.quick)
        cluster = ClusterConfig(NUM_REPLICAS, ReplicaConfig(num_blocks=d.num_blocks),
                                RouterConfig())
        log, sim_bound, causes = record_run(cluster, workload)
        capacity = NUM_REPLICAS * d.num_blocks
        exact = {m: exact_hit_ratio(log, int(m * capacity), BLOCK_SIZE) for m in MULTIPLES}
        assert math.isclose(exact[1.0], sim_bound), "the replay is not the simulator's LRU"
        routed, rate = online(log, config, capacity, releases=False)
        logs.append((log, rate))
        row = {"capacity_blocks": capacity, "sample_rate": rate,
               "num_requests": sum(isinstance(op, Served) for op in log),
               "num_finished": sum(isinstance(op, Released) for op in log), "exact": exact,
               **estimates(log, config, capacity, exact, "", not args.no_spread),
               **estimates(log, fixed, capacity, exact, "_fixed_rate", not args.no_spread),
               "online_routers_only": routed,
               "err_routers_only": {m: routed[m] - exact[m] for m in MULTIPLES},
               "miss_causes_tokens": causes.causes._asdict(),
               "uncached_tokens": causes.uncached_tokens, "causes_sum_ok": causes.sum_ok}
        rows[name] = row
        print(f"{name:<24} cap {capacity:>7} blocks  exact 0.5x/1x/2x "
              + " ".join(f"{exact[m]:.4f}" for m in MULTIPLES), flush=True)
        for suffix, label in (("", f"R_t = {rate:g}"), ("_fixed_rate", f"R = {args.rate:g}")):
            print(f"  {label:<12} online " + " ".join(f"{row['online' + suffix][m]:.4f}"
                                                     for m in MULTIPLES)
                  + ("  spread max |err| " + " ".join(
                      f"{row['err_spread_max' + suffix][m]:.4f}" for m in MULTIPLES)
                     if not args.no_spread else ""), flush=True)
    out: dict = {"rate": args.rate, "capacity_sampled_blocks": config.capacity_sampled_blocks}
    if rows:
        out.update(sim_figures(rows, logs, args))
    if not args.skip_actor:
        per_s, n = actor_accesses_per_s(args.actor_prompts)
        print(f"actor: {n} sampled accesses (Mooncake prompts, R = 1) at {per_s:,.0f}/s")
        out["actor_accesses_per_s"] = round(per_s)
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    out["load_avg"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(json.dumps(out))
    return out


def estimates(log: list, config: HitCurveConfig, capacity_blocks: int, exact: dict,
              suffix: str, spread: bool) -> dict:
    """The online estimate with the live key, its error, and (`spread`) the largest and
    mean |error| over 8 other sampling keys; each name ends in `suffix`."""
    live, _ = online(log, config, capacity_blocks)
    out = {"online" + suffix: live, "err" + suffix: {m: live[m] - exact[m] for m in MULTIPLES}}
    if spread:
        others = [online(log, config, capacity_blocks, True, k)[0] for k in range(1, 9)]
        errs = [[abs(o[m] - exact[m]) for o in others] for m in MULTIPLES]
        out["err_spread_max" + suffix] = {m: max(e) for m, e in zip(MULTIPLES, errs)}
        out["err_spread_mean" + suffix] = {m: statistics.fmean(e)
                                           for m, e in zip(MULTIPLES, errs)}
    return out


def sim_figures(rows: dict, logs: list, args: argparse.Namespace) -> dict:
    p50_us, p90_us, take_us = gateway_cost_us(logs)
    print(f"decision path per routed prompt: p50 {p50_us:.2f} us, p90 {p90_us:.2f} us; "
          f"sampling off the path (take) {take_us:.2f} us of CPU a prompt")
    out = {
        "bound_abs_err_max": max(abs(r["err"][1.0]) for r in rows.values()),
        "curve_abs_err_max": max(abs(r["err"][m]) for r in rows.values() for m in (0.5, 2.0)),
        "bound_abs_err_max_fixed_rate": max(abs(r["err_fixed_rate"][1.0])
                                            for r in rows.values()),
        "curve_abs_err_max_fixed_rate": max(abs(r["err_fixed_rate"][m])
                                            for r in rows.values() for m in (0.5, 2.0)),
        "bound_abs_err_max_routers_only": max(abs(r["err_routers_only"][1.0])
                                              for r in rows.values()),
        "curve_abs_err_max_routers_only": max(abs(r["err_routers_only"][m])
                                              for r in rows.values() for m in (0.5, 2.0)),
        "causes_sum_ok": all(r["causes_sum_ok"] for r in rows.values()),
        "gateway_cost_us_p50": round(p50_us, 3), "gateway_cost_us_p90": round(p90_us, 3),
        "sampling_off_path_cpu_us_per_prompt": round(take_us, 3),
    }
    for suffix in ("", "_fixed_rate") if not args.no_spread else ():
        spread = [r["err_spread_max" + suffix] for r in rows.values()]
        out["bound_abs_err_spread_max" + suffix] = max(s[1.0] for s in spread)
        out["curve_abs_err_spread_max" + suffix] = max(s[m] for s in spread for m in (0.5, 2.0))
    out["workloads"] = {n: {k: ({str(m): round(v, 5) for m, v in r[k].items()}
                                if isinstance(r[k], dict) else r[k]) for k in r}
                        for n, r in rows.items()}
    return out


if __name__ == "__main__":
    main()
