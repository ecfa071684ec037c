"""What a simulated run measured, per policy: hits, latency, throughput, balance.

Definitions (the same in the table, the JSON line and benchmarks/NOTEBOOK.md):
- hit_rate: prompt tokens served from cache (device + host tier) at first admission, over
  all prompt tokens of the served requests; exactly what the replicas' kv.manager
  PrefixCacheStats count.
- pooled_bound_hit_rate: the same ratio for one LRU cache of the cluster's total capacity
  serving the same request order (benchmarks/simlib/pooled.py).
- ttft: first token time - arrival (release) time; tpot: (finish - first token) /
  (output tokens - 1), per request, then averaged; throughput_tok_s: output tokens over the
  span from the first arrival to the last finish.
- load_share: the busiest replica's work over the mean replica's work, where a replica's
  work is the tokens it computed (uncached prefill tokens, recomputation after preemption
  included, plus decode tokens). 1.0 is perfect balance.
- request_share / min_request_share: the most / least routed replica's request count over
  the mean (min 0: a replica got nothing).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from benchmarks.simlib.cluster import RunResult


@dataclass(frozen=True)
class Summary:
    label: str
    rate_qps: float
    num_replicas: int
    num_requests: int
    num_finished: int  # ran to their length
    num_rejected: int  # longer than a replica's KV capacity
    num_failed: int  # could never be scheduled
    hit_rate: float
    device_hit_rate: float
    host_hit_rate: float
    predicted_hit_rate: float  # what the router expected at routing time
    pooled_bound_hit_rate: float
    hit_rate_over_bound: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_mean_s: float
    throughput_tok_s: float
    load_share: float
    request_share: float  # the same over routed request counts
    min_request_share: float  # the least routed replica's request count over the mean
    num_preemptions: int
    sim_duration_s: float
    wall_s: float
    cpu_s: float  # CPU time of the run: what the wall time is on an idle core
    # several gateways sharing pending marks, per routed request: the block hashes its
    # router sent the others, and those the others marked (summed over them)
    shared_blocks_per_decision: float = 0.0
    marked_blocks_per_decision: float = 0.0

    def as_dict(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v)
                for k, v in asdict(self).items()}


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(run: RunResult, label: str, rate_qps: float, wall_s: float, cpu_s: float
              ) -> Summary:
    """`wall_s` and `cpu_s`: what building and running the cluster took."""
    served = [r for r in run.records if r.replica_id is not None]
    started = [r for r in served if r.first_token_s is not None]
    prompt_tokens = sum(r.num_prompt_tokens for r in served)
    device = sum(r.cached_device_tokens for r in served)
    host = sum(r.cached_host_tokens for r in served)
    predicted = sum(r.predicted_hit_tokens for r in served)
    ttfts = [r.first_token_s - r.arrival_s for r in started]  # type: ignore[operator]
    tpots = [(r.finish_s - r.first_token_s) / (r.num_output_tokens - 1)  # type: ignore
             for r in started if r.num_output_tokens > 1]
    output_tokens = sum(r.num_output_tokens for r in served)
    span_s = (max(r.finish_s for r in run.records)  # type: ignore[type-var]
              - min(r.arrival_s for r in run.records)) if run.records else 0.0
    work = [rep.num_tokens_computed for rep in run.replicas]
    routed = [0] * len(run.replicas)
    index_of = {rep.replica_id: i for i, rep in enumerate(run.replicas)}
    for r in served:
        routed[index_of[r.replica_id]] += 1
    hit_rate = (device + host) / prompt_tokens if prompt_tokens else 0.0
    bound = run.pooled.hit_rate
    return Summary(
        label=label, rate_qps=rate_qps, num_replicas=len(run.replicas),
        num_requests=len(run.records),
        num_finished=sum(r.finish_reason in ("length", "stop") for r in run.records),
        num_rejected=sum(r.finish_reason == "rejected" for r in run.records),
        num_failed=sum(r.finish_reason == "error" for r in run.records),
        hit_rate=hit_rate,
        device_hit_rate=device / prompt_tokens if prompt_tokens else 0.0,
        host_hit_rate=host / prompt_tokens if prompt_tokens else 0.0,
        predicted_hit_rate=predicted / prompt_tokens if prompt_tokens else 0.0,
        pooled_bound_hit_rate=bound,
        hit_rate_over_bound=hit_rate / bound if bound else float("nan"),
        ttft_p50_s=_pct(ttfts, 50), ttft_p90_s=_pct(ttfts, 90), ttft_p99_s=_pct(ttfts, 99),
        tpot_mean_s=float(np.mean(tpots)) if tpots else float("nan"),
        throughput_tok_s=output_tokens / span_s if span_s > 0 else float("nan"),
        load_share=max(work) / (sum(work) / len(work)) if sum(work) else 1.0,
        request_share=max(routed) / (sum(routed) / len(routed)) if sum(routed) else 1.0,
        min_request_share=min(routed) / (sum(routed) / len(routed)) if sum(routed) else 1.0,
        num_preemptions=sum(rep.core.scheduler.num_preemptions for rep in run.replicas),
        sim_duration_s=run.sim_duration_s, wall_s=wall_s, cpu_s=cpu_s,
        shared_blocks_per_decision=run.num_shared_blocks / len(served) if served else 0.0,
        marked_blocks_per_decision=run.num_marked_blocks / len(served) if served else 0.0)


_COLUMNS = [("policy", "label", "{:<16}"), ("qps", "rate_qps", "{:>7.2f}"),
            ("hit", "hit_rate", "{:>6.3f}"), ("bound", "pooled_bound_hit_rate", "{:>6.3f}"),
            ("hit/bnd", "hit_rate_over_bound", "{:>7.3f}"),
            ("ttft50", "ttft_p50_s", "{:>8.3f}"), ("ttft90", "ttft_p90_s", "{:>8.3f}"),
            ("ttft99", "ttft_p99_s", "{:>8.3f}"), ("tpot_ms", "tpot_mean_s", "{:>8.2f}"),
            ("tok/s", "throughput_tok_s", "{:>9.0f}"), ("share", "load_share", "{:>6.3f}"),
            ("preempt", "num_preemptions", "{:>7d}"), ("wall_s", "wall_s", "{:>7.1f}"),
            ("cpu_s", "cpu_s", "{:>7.1f}")]


def table(summaries: list[Summary]) -> str:
    label_width = max([16] + [len(s.label) for s in summaries])
    head = " ".join(f"{name:>{len(fmt.format(0) if 'd' in fmt else fmt.format(0.0))}}"
                    if name != "policy" else f"{name:<{label_width}}" for name, _, fmt in _COLUMNS)
    rows = [head]
    for s in summaries:
        cells = []
        for _, attr, fmt in _COLUMNS:
            v = getattr(s, attr)
            if attr == "tpot_mean_s":
                v = v * 1000
            cells.append(f"{v:<{label_width}}" if attr == "label" else fmt.format(v))
        rows.append(" ".join(cells))
    return "\n".join(rows)
