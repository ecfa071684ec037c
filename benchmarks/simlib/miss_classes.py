"""Why each missed prompt block was missed, read off the engines and the router at routing.

For every request, just before the router decides, this records which replicas' engines
hold a leading run of the prompt's blocks (device pool), which are computing them (the
engine's pending blocks), what the router believes each replica holds (its index, or its
routed history in approximate mode), and every block hash any earlier prompt had. Once the
run is over, each prompt block past the request's delivered hit is put in one class:

    never_seen         no earlier prompt had it: nobody could have hit it
    evicted_everywhere an earlier prompt had it, no replica held or was computing it
    in_flight          no replica held it, one was computing it (an earlier request's prefill)
    elsewhere_known    another replica held it and the router knew (it chose the load)
    elsewhere_unknown  another replica held it, the router did not know yet (event delay)
    here_gone          the chosen replica held it at routing, but not when the request ran

Counted in tokens (16 a block), over all prompt tokens: the classes add up to the miss rate
less the last partial block of each prompt and the engine's "last token computes" rule.

The live router's four causes (router/core/miss_causes.py: cold, capacity, placement, race)
come from the same Router the simulator runs: `count_miss_causes` hands each router the
engine's delivered count at the end of every request, `miss_causes_check` adds them up
against the prompt tokens the engines did not serve from cache.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from benchmarks.simlib.cluster import ClusterSim, RunResult
from router.core.miss_causes import MissTokens

CLASSES = ("never_seen", "evicted_everywhere", "in_flight", "elsewhere_known",
           "elsewhere_unknown", "here_gone")


def _leading(held, hashes) -> int:
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n


def run_with_miss_classes(sim: ClusterSim) -> tuple[RunResult, dict[str, float]]:
    """Runs `sim`; each class's share of all prompt tokens."""
    seen: set = set()
    at_routing: dict[str, tuple] = {}  # request -> (chosen, held, computing, view, seen)
    for router in sim.routers:  # every router process's decisions
        router.route = _recording(sim, router, router.route, seen, at_routing)
    result = sim.run()
    return result, _classify(sim, result, at_routing)


def _recording(sim: ClusterSim, router, route, seen: set, at_routing: dict):
    def recording_route(request_id, block_hashes, num_prompt_tokens, replica_ids,
                        max_tokens=0):
        held = {rep.replica_id: _leading(rep.core.kv.pool.cached, block_hashes)
                for rep in sim.replicas}
        computing = set().union(*(rep.core.kv._pending for rep in sim.replicas))
        view = router._match(block_hashes, replica_ids, router._on_history(replica_ids), {})
        decision = route(request_id, block_hashes, num_prompt_tokens, replica_ids, max_tokens)
        was_seen = [h in seen for h in block_hashes]
        seen.update(block_hashes)
        at_routing[request_id] = (decision.replica_id, held, computing, view, was_seen,
                                  block_hashes)
        return decision
    return recording_route


def _classify(sim: ClusterSim, result: RunResult, at_routing: dict) -> dict[str, float]:
    block_size = sim.config.replica.block_size
    counts: Counter = Counter()
    total = 0
    for rec in result.records:
        total += rec.num_prompt_tokens
        if rec.request_id not in at_routing:
            continue
        chosen, held, computing, view, was_seen, hashes = at_routing[rec.request_id]
        hit_blocks = (rec.cached_device_tokens + rec.cached_host_tokens) // block_size
        for i in range(hit_blocks, len(hashes)):
            if not was_seen[i]:
                cls = "never_seen"
            elif held[chosen] > i:
                cls = "here_gone"
            elif any(n > i for rid, n in held.items() if rid != chosen):
                known = any(n > i and view[rid].num_device_blocks > i
                            for rid, n in held.items() if rid != chosen and rid in view)
                cls = "elsewhere_known" if known else "elsewhere_unknown"
            elif hashes[i] in computing:
                cls = "in_flight"
            else:
                cls = "evicted_everywhere"
            counts[cls] += block_size
    return {c: counts[c] / total if total else 0.0 for c in CLASSES}


class MissCauseCheck(NamedTuple):
    causes: MissTokens  # every router's totals, summed
    uncached_tokens: int  # prompt tokens of routed requests the engines did not serve cached
    sum_ok: bool  # the causes add up to uncached_tokens exactly


def count_miss_causes(sim: ClusterSim) -> None:
    """Before `sim.run()`: each router's `on_finished` gets the delivered count (device +
    host cached tokens) the engine recorded for the request, as the live router gets it
    from the engine replica, so the routers count the causes."""
    for router in sim.routers:
        router.on_finished = _with_delivered(sim, router.on_finished)


def _with_delivered(sim: ClusterSim, on_finished):
    def on_finished_with_delivered(request_id: str, delivered_tokens: int | None = None,
                                   output_tokens: int | None = None):
        rec = sim.records.get(request_id)
        if delivered_tokens is None and rec is not None:  # the engine's counts are set
            delivered_tokens = rec.cached_device_tokens + rec.cached_host_tokens
        return on_finished(request_id, delivered_tokens, output_tokens)
    return on_finished_with_delivered


def miss_causes_check(sim: ClusterSim, result: RunResult) -> MissCauseCheck:
    """After a run started with `count_miss_causes`: the causes, and whether they add up
    exactly to the routed requests' uncached prompt tokens (n - delivered, each)."""
    causes = sum((router.misses.totals for router in sim.routers), MissTokens())
    uncached = sum(r.num_prompt_tokens - r.cached_device_tokens - r.cached_host_tokens
                   for r in result.records if r.replica_id is not None)
    return MissCauseCheck(causes, uncached, causes.total == uncached)


def run_with_miss_causes(sim: ClusterSim) -> tuple[RunResult, MissCauseCheck]:
    """Runs `sim` counting the routers' miss causes."""
    count_miss_causes(sim)
    result = sim.run()
    return result, miss_causes_check(sim, result)
