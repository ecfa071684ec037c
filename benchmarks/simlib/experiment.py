"""Runs of the simulated cluster: one policy at one rate, a comparison, a rate ladder.

Each workload has documented defaults (`DEFAULTS`): the replicas' device KV capacity, the
rate of a single run, and the per-replica rates of its ladder. The capacities make the
shared prefixes need several replicas' memory, as llm-d's benchmark does; the arrival
rates scale with the number of replicas, so every size sees the same load per replica.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.simlib import workloads as wl
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim
from benchmarks.simlib.conversation import conversation
from benchmarks.simlib.report import Summary, summarize
from router.core.config import RouterConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
MOONCAKE_TRACE = REPO_ROOT.parent / "shared" / "workloads" / "mooncake_synthetic_trace.jsonl"


@dataclass(frozen=True)
class WorkloadDefaults:
    num_blocks: int  # device KV blocks per replica (16 tokens each)
    rate_per_replica: float  # a single run's rate, req/s per replica (mooncake: see below)
    ladder_per_replica: tuple[float, ...]  # req/s per replica (mooncake: see below)
    why: str


DEFAULTS: dict[str, WorkloadDefaults] = {
    "generated_shared_prefix": WorkloadDefaults(
        2048, math.inf, (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, math.inf),
        "64 prefixes x 128 blocks = 8,192 blocks: four replicas' memory; all at once"),
    "shared_prefix": WorkloadDefaults(
        19208, 1.0, (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5),
        "llm-d's run: 307,328 tokens of KV an instance; its 750 prompts (150 x 6,000 + "
        "750 x 1,200 tokens) fill 73% of 8 replicas, 5.9 replicas' memory"),
    "multi_turn": WorkloadDefaults(
        8192, 8.0, (2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0),
        "256 histories of up to 2,880 tokens = 46,080 blocks: 5.6 replicas' memory"),
    "prefix_repetition": WorkloadDefaults(
        2048, math.inf, (4.0, 8.0, 16.0, 32.0, math.inf),
        "10 prefixes of 256 tokens: small, any capacity holds them"),
    "conversation": WorkloadDefaults(
        4096, 0.25, (0.125, 0.25, 0.5, 1.0),
        "sessions growing to ~10k tokens (625 blocks); at 2 req/s ~90 sessions, ~60 live "
        "at a time: 8 x 4,096 blocks hold about half of their final contexts"),
    "burst": WorkloadDefaults(
        8192, math.inf, (math.inf,),
        "400 copies of one 2,048-token prompt, then 400 that differ in their last 8 "
        "tokens: 128 blocks each way, any capacity holds the prompt"),
    "mooncake": WorkloadDefaults(
        25000, 1.0, (1.0, 2.0, 4.0, 8.0),
        "an H100 80 GB serving Llama 3 8B holds ~400k tokens of KV; the trace's shared "
        "blocks (9.3M tokens) need 23 replicas' memory"),
}


def build_workload(name: str, rate_per_replica: float, num_replicas: int, seed: int = 0,
                   quick: bool = False, trace: Path = MOONCAKE_TRACE) -> wl.Workload:
    """The workload at `rate_per_replica` x `num_replicas` req/s. The Mooncake trace as
    published counts as the load of 8 replicas: its arrivals are sped up
    `rate_per_replica x num_replicas / 8` times. `quick` shrinks it for smoke tests only."""
    rate = rate_per_replica * num_replicas
    if name == "generated_shared_prefix":
        kw = dict(num_groups=8, prompts_per_group=4, output_len=16) if quick else {}
        return wl.generated_shared_prefix(rate_qps=rate, seed=seed, **kw)
    if name == "shared_prefix":
        kw = dict(num_groups=8, prompts_per_group=3, output_len=16) if quick else {}
        return wl.shared_prefix(rate_qps=rate, seed=seed, **kw)
    if name == "multi_turn":
        kw = dict(num_clients=8, num_rounds=3, output_len=8) if quick else {}
        return wl.multi_turn(rate_qps=rate, seed=seed, **kw)
    if name == "prefix_repetition":
        kw = dict(num_prompts=40, output_len=8) if quick else {}
        return wl.prefix_repetition(rate_qps=rate, seed=seed, **kw)
    if name == "conversation":
        kw = dict(duration_s=40.0, max_context_tokens=2000) if quick else {}
        return conversation(rate_qps=rate, seed=seed, **kw)
    if name == "burst":
        return wl.burst(**(dict(num_prompts=24, output_len=8) if quick else {}))
    if name == "mooncake":
        return wl.mooncake(trace, time_scale=rate_per_replica * num_replicas / 8,
                           max_requests=60 if quick else None)
    raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(wl.WORKLOAD_NAMES)}")


def offered_qps(workload: wl.Workload) -> float:
    """Requests over the arrival span (inf when they all arrive at once)."""
    times = [it.arrival_s for it in workload.items]
    span = max(times) - min(times)
    return workload.num_requests / span if span > 0 else math.inf


@dataclass(frozen=True)
class Contender:
    """A router setting to compare: a policy, possibly in approximate mode, behind one
    gateway or several (ClusterConfig's num_routers, router_spread, share_pending_delay_s,
    share_work, rotate_candidates, offset_by_id)."""

    label: str
    router: RouterConfig
    num_routers: int = 1
    router_spread: str = "random"
    share_pending_delay_s: float | None = None
    share_work: bool = False
    rotate_candidates: bool = False
    offset_by_id: bool = False


def contenders(policy: str, base: RouterConfig, others: tuple[str, ...] = ()
               ) -> list[Contender]:
    """The policy under test, then the round-robin and approximate baselines, then others."""
    out = [Contender(policy, replace(base, policy=policy, approximate=False))]
    if policy != "round_robin":
        out.append(Contender("round_robin", replace(base, policy="round_robin",
                                                    approximate=False)))
    out.append(Contender("approximate", replace(base, policy="cache_aware", approximate=True)))
    for name in others:
        if name not in {c.label for c in out}:
            out.append(Contender(name, replace(base, policy=name, approximate=False)))
    return out


@dataclass(frozen=True)
class WorkloadSpec:
    """What `build_workload` needs: cheap to send to a worker process."""

    name: str
    rate_per_replica: float
    num_replicas: int
    seed: int = 0
    quick: bool = False
    trace: Path = MOONCAKE_TRACE

    def build(self) -> wl.Workload:
        return _build_cached(self)


@functools.lru_cache(maxsize=2)
def _build_cached(spec: WorkloadSpec) -> wl.Workload:
    return build_workload(spec.name, spec.rate_per_replica, spec.num_replicas, spec.seed,
                          spec.quick, spec.trace)


@dataclass(frozen=True)
class Task:
    cluster: ClusterConfig
    workload: WorkloadSpec
    label: str


def run_one(task: Task) -> Summary:
    workload = task.workload.build()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    run = ClusterSim(task.cluster, workload).run()
    return summarize(run, task.label, offered_qps(workload), time.perf_counter() - wall0,
                     time.process_time() - cpu0)


def run_all(tasks: list[Task], jobs: int = 1) -> Iterator[Summary]:
    """Summaries of the tasks, in order; `jobs` > 1 runs them in worker processes (each
    run is deterministic on its own, so the results do not depend on `jobs`)."""
    if jobs <= 1 or len(tasks) <= 1:
        yield from map(run_one, tasks)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(min(jobs, len(tasks))) as pool:
        yield from pool.imap(run_one, tasks)


def saturation_index(throughputs: list[float], growth: float = 0.05) -> int | None:
    """The first ladder step whose throughput grows less than `growth` over the previous
    one: where that contender is saturated. None when it never stops growing."""
    for i in range(1, len(throughputs)):
        if throughputs[i] < throughputs[i - 1] * (1 + growth):
            return i
    return None
