"""Where a grouped workload's prompt misses come from, read off the engines at routing time.

The grouped workloads (shared_prefix, generated_shared_prefix) send prompts of two segments:
a group's system prompt, then one of its questions. For every routed request this looks,
just before the router decides, at which replicas' engines hold each segment (a leading run
of its blocks in the block pool) and sorts the outcome on the replica chosen:

    prefix: first (its group was never routed before), hit (held whole there), elsewhere
            (held whole on another replica only), partial (some leading blocks somewhere,
            whole nowhere), nowhere (evicted everywhere, or not computed yet: an earlier
            request of its group is still in its prefill)
    question (its second and later sends only): the same, and for nowhere whether the
            request went back to the replica its question was sent to last time (same)
            or elsewhere (moved)

A miss that is "nowhere, same" was lost to that replica's own capacity, not to where the
router sent it: routing on the routed history would have sent it to the same place.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from benchmarks.simlib.cluster import ClusterSim, RunResult


def _leading_run(pool, hashes: Sequence[bytes]) -> int:
    n = 0
    for h in hashes:
        if pool.lookup(h) is None:
            break
        n += 1
    return n


def _outcome(held: dict[str, int], chosen: str, num_blocks: int) -> str:
    if held[chosen] == num_blocks:
        return "hit"
    best = max(held.values())
    if best == num_blocks:
        return "elsewhere"
    return "partial" if best else "nowhere"


def run_classified(sim: ClusterSim, prefix_blocks: int, question_blocks: int
                   ) -> tuple[RunResult, Counter]:
    """Runs `sim` (a grouped workload whose segments are whole blocks) and counts the
    outcomes above. `prefix_blocks` and `question_blocks`: each segment's length in
    blocks."""
    items = {it.request_id: it for it in sim.workload.items}
    counts: Counter = Counter()
    last_replica_of: dict[str, str] = {}  # question -> where it was sent last
    route = sim.router.route

    def classified_route(request_id, block_hashes, num_prompt_tokens, replica_ids,
                         max_tokens=0):
        sys_key, q_key = (seg.key for seg in items[request_id].segments)
        pools = {rep.replica_id: rep.core.kv.pool for rep in sim.replicas}
        prefix = block_hashes[:prefix_blocks]
        question = block_hashes[prefix_blocks:prefix_blocks + question_blocks]
        held_prefix = {rid: _leading_run(pool, prefix) for rid, pool in pools.items()}
        held_question = {rid: _leading_run(pool, question) if held_prefix[rid] == prefix_blocks
                         else 0 for rid, pool in pools.items()}
        decision = route(request_id, block_hashes, num_prompt_tokens, replica_ids, max_tokens)
        chosen = decision.replica_id
        if sys_key in last_replica_of:  # its group was routed before
            counts["prefix " + _outcome(held_prefix, chosen, prefix_blocks)] += 1
        else:
            counts["prefix first"] += 1
        last = last_replica_of.get(q_key)
        if last is None:
            counts["question first"] += 1
        else:
            outcome = _outcome(held_question, chosen, question_blocks)
            if outcome == "nowhere":
                outcome += ", same" if last == chosen else ", moved"
            counts["question " + outcome] += 1
        last_replica_of[sys_key] = last_replica_of[q_key] = chosen
        return decision

    sim.router.route = classified_route
    result = sim.run()
    return result, counts
