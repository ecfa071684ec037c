"""The simulator's prediction of a live kvroute run, request for request.

    python benchmarks/sim_vs_live.py RUN.jsonl [RUN.jsonl ...]

Each RUN.jsonl is one run bench_peers.py wrote (its summary, then every request: the
prompt exactly as sent, when it was sent, the tokens it got cached). The simulator
(benchmarks/simlib/cluster.py: the production router, scheduler and KV manager on a virtual
clock) replays the same prompts, each at the time it was sent live, against the same
number of replicas with the same pools and step budgets (each step stretched so that the
simulated time per output token is the live one), with the live event timings:
the engine publishes every --publish-interval-s (kvroute engine's pump: 10 ms) and a batch
reaches the router --event-delay-s later (ZMQ, the index actor, the mirror's long poll).
Approximate runs get no events, as live. Requests are spread at random over as many routers
as the run had gateway processes (its summary's num_gateways; --routers for a run that does
not say), each its own Router with its own pending marks, load count and routed history.
It prints predicted against live hit rates; the error is predicted minus live.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.peers.measure import prompt_token_ids  # noqa: E402
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim, RunResult  # noqa: E402
from benchmarks.simlib.miss_classes import run_with_miss_classes  # noqa: E402
from benchmarks.simlib.replica import ReplicaConfig  # noqa: E402
from benchmarks.simlib.workloads import Segment, WorkItem, Workload  # noqa: E402
from kv.hashing import BlockHash, block_hashes  # noqa: E402
from router.core.router import RouterConfig  # noqa: E402

PUBLISH_INTERVAL_S = 0.01  # worker/openai_server/main.py: ServerConfig.kv_events_interval_s
EVENT_DELAY_S = 0.02
NUM_ROUTERS = 1  # kvroute serve's gateway processes (--gateways, 1 by default)


class ReplayPrompts:
    """Stands in for the simulator's PromptBuilder: a request's one segment is keyed by
    its id, and its tokens are the ones sent live."""

    def __init__(self, prompts: dict[str, list[int]], block_size: int, root: BlockHash):
        self._prompts = prompts
        self._block_size = block_size
        self._root = root

    def build(self, segments: Sequence[Segment], history_token_ids: Sequence[int] = (),
              history_hashes: Sequence[BlockHash] = ()) -> tuple[list[int], list[BlockHash]]:
        assert not history_token_ids, "a replay has no multi-turn parents"
        ids = self._prompts[segments[0].key]
        return ids, block_hashes(ids, self._block_size, self._root)


def load_run(path: Path) -> tuple[dict, list[dict]]:
    with open(path) as f:
        summary = json.loads(f.readline())
        return summary, [json.loads(line) for line in f]


def replay(summary: dict, records: list[dict], publish_interval_s: float = PUBLISH_INTERVAL_S,
           event_delay_s: float = EVENT_DELAY_S, step_time_scale: float = 1.0,
           classes: dict | None = None, num_routers: int = NUM_ROUTERS,
           router_overrides: dict | None = None) -> RunResult:
    """The live run's requests in the simulator, as `summary['router']` routed them
    (`router_overrides`: RouterConfig fields for a what-if)."""
    records = sorted(records, key=lambda r: r["sent_s"])
    prompts = {r["request_id"]: prompt_token_ids(r["prompt"]) for r in records}
    items = tuple(WorkItem(r["request_id"], r["sent_s"],
                           (Segment(r["request_id"], len(prompts[r["request_id"]])),),
                           max(1, r["completion_tokens"])) for r in records)
    replica = ReplicaConfig(num_blocks=summary["num_blocks"],
                            max_num_seqs=summary["max_num_seqs"],
                            max_num_batched_tokens=summary["max_num_batched_tokens"],
                            preset=summary["sim_preset"], step_time_scale=step_time_scale)
    approximate = summary["router"] == "kvroute_approximate"
    router = RouterConfig(approximate=approximate, approx_capacity_blocks=summary["num_blocks"],
                          # runs recorded before the setting existed had it off
                          **{"continuation_affinity": summary.get("continuation_affinity",
                                                                  False),
                             **(router_overrides or {})})
    config = ClusterConfig(summary["num_workers"], replica, router,
                           event_delay_s=event_delay_s, publish_interval_s=publish_interval_s,
                           model_name="tiny",
                           num_routers=summary.get("num_gateways", num_routers),
                           # the live load sends each request's answer length as max_tokens
                           max_tokens_sent="exact")
    sim = ClusterSim(config, Workload(summary["workload"], items))
    sim.prompts = ReplayPrompts(prompts, replica.block_size, sim.root)
    if classes is None:
        return sim.run()
    run, shares = run_with_miss_classes(sim)
    classes.update(shares)
    return run


def hit_rate(run: RunResult) -> float:
    prompt = sum(r.num_prompt_tokens for r in run.records)
    cached = sum(r.cached_device_tokens + r.cached_host_tokens for r in run.records)
    return cached / prompt if prompt else 0.0


def tpot_mean_s(run: RunResult) -> float:
    tpots = [(r.finish_s - r.first_token_s) / (r.num_output_tokens - 1) for r in run.records
             if r.num_output_tokens > 1 and r.finish_s is not None
             and r.first_token_s is not None]
    return sum(tpots) / len(tpots)


def predict(path: Path, **timings) -> dict:
    """The prediction at the modelled step times, then with every step stretched so the
    simulated time per output token is the live one (the live engines share a busy CPU)."""
    summary, records = load_run(path)
    run = replay(summary, records, **timings)
    scale = summary["tpot_mean_s"] / tpot_mean_s(run)
    classes: dict[str, float] = {}
    fitted = replay(summary, records, step_time_scale=scale, classes=classes, **timings)
    predicted = hit_rate(fitted)
    return {"workload": summary["workload"], "router": summary["router"],
            "seed": summary["seed"], "live_hit_rate": summary["cached_token_rate"],
            "sim_hit_rate_unfitted": hit_rate(run), "step_time_scale": scale,
            "sim_hit_rate": predicted, "error": predicted - summary["cached_token_rate"],
            "live_bound": summary["bound_hit_rate"], "sim_bound": fitted.pooled.hit_rate,
            "sim_miss_classes": classes, "live_miss_classes": summary.get("live_miss_classes")}


def predict_runs(runs: list[dict], lines: list[str], **timings) -> list[float]:
    """Predicts each run (bench_peers.py's summaries, with their raw file); appends a
    line per run to `lines`; the errors."""
    errors = []
    lines.append(f"{'simulator vs live':<36}{'live hit':>9}{'sim x1':>9}{'scale':>7}"
                 f"{'sim hit':>9}{'error':>8}{'live bnd':>9}{'sim bnd':>9}")
    for r in runs:
        p = predict(Path(r["raw"]), **timings)
        errors.append(p["error"])
        lines.append(f"{p['workload'] + ' ' + p['router'] + ' s' + str(p['seed']):<36}"
                     f"{p['live_hit_rate']:>9.4f}{p['sim_hit_rate_unfitted']:>9.4f}"
                     f"{p['step_time_scale']:>7.2f}{p['sim_hit_rate']:>9.4f}{p['error']:>+8.4f}"
                     f"{p['live_bound']:>9.4f}{p['sim_bound']:>9.4f}")
        for side in ("live", "sim"):
            shares = p[f"{side}_miss_classes"]
            if shares:
                lines.append(f"    {side} misses: " + ", ".join(
                    f"{k} {v:.4f}" for k, v in shares.items()))
    return errors


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--publish-interval-s", type=float, default=PUBLISH_INTERVAL_S)
    p.add_argument("--event-delay-s", type=float, default=EVENT_DELAY_S)
    p.add_argument("--routers", type=int, default=NUM_ROUTERS,
                   help="router processes (the live gateways), each with its own marks")
    args = p.parse_args(argv)
    lines: list[str] = []
    runs = [{"raw": str(path)} for path in args.runs]
    errors = predict_runs(runs, lines, publish_interval_s=args.publish_interval_s,
                          event_delay_s=args.event_delay_s, num_routers=args.routers)
    print("\n".join(lines))
    out = {"sim_vs_live_abs_err_max": round(max(abs(e) for e in errors), 4)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
