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
"""

from __future__ import annotations

from collections import Counter

from benchmarks.simlib.cluster import ClusterSim, RunResult

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
