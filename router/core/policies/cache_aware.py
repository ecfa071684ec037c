"""Cache-aware routing: the fewest tokens to compute, plus a price on queued work.

    cost(r) = uncached prompt tokens on r            (a host hit costs host_cost_fraction
                                                      of a recompute: it is copied back)
            + load_weight x outstanding work on r    (tokens, router.core.load)

The minimum wins (ties: less load, then less work routed here so far, then the earlier
candidate); the ranking is the candidates in that order. The load term is what keeps a
shared first block from pulling every request onto one replica: the few tokens it saves are
soon outweighed by the work queued there. The routed-work tie-break matters whenever
replicas sit idle: every new prefix then ties at load 0, and "the earlier candidate" would
hand all of them to the first replica (a load share of 1.25 on the Mooncake trace in
benchmarks/NOTEBOOK.md, 1.01 with the tie-break).

Imbalance guard: if the winner's load exceeds the least loaded candidate's by more than
`imbalance_threshold` tokens, the cache gain must pay for the whole gap, token for token
(not discounted by load_weight), or the request goes to the least loaded candidate. A
modest load_weight routes for locality in steady state; the guard stops one hot prefix from
building a queue that the discount would tolerate.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from router.core.policies.base import RankingPolicy, ReplicaView, RouteQuery
from router.core.prefix_match import PrefixMatch

if TYPE_CHECKING:
    from router.core.config import RouterConfig


class CacheAwarePolicy(RankingPolicy):
    name = "cache_aware"
    uses_index = True

    def __init__(self, config: RouterConfig):
        self.block_size = config.block_size
        self.load_weight = config.load_weight
        self.host_cost_fraction = config.host_cost_fraction
        self.imbalance_threshold = config.imbalance_threshold
        # Work routed so far per replica (prefill cost + max_tokens): the last tie-break, so
        # that candidates equal on cost and load (all idle) do not all go to the first one.
        self._routed_tokens: dict[str, float] = {}

    def prefill_cost_tokens(self, match: PrefixMatch | None, num_prompt_tokens: int) -> float:
        """Tokens of prefill the request costs on a replica with this cached prefix."""
        if match is None:
            return float(num_prompt_tokens)
        device_tokens, host_tokens = match.hit_tokens(self.block_size, num_prompt_tokens)
        return (num_prompt_tokens - device_tokens - host_tokens
                + self.host_cost_fraction * host_tokens)

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        """Candidates by (cost, load, work routed so far, listed order); the imbalance guard
        may put the least loaded one first."""
        matches, load_of, w = view.matches, view.load, self.load_weight
        num_prompt_tokens = float(query.num_prompt_tokens)
        routed_of = self._routed_tokens.get
        ids = query.replica_ids
        keys = []
        prefills = []
        for i, rid in enumerate(ids):  # hot loop (64 replicas): plain floats
            load = load_of(rid)
            match = matches.get(rid)
            prefill = (self.prefill_cost_tokens(match, query.num_prompt_tokens) if match
                       else num_prompt_tokens)
            prefills.append(prefill)
            keys.append((prefill + w * load, load, routed_of(rid, 0.0), i))
        keys.sort()
        order = [k[3] for k in keys]
        best, best_prefill = keys[0], prefills[keys[0][3]]
        if self.imbalance_threshold != math.inf:
            least = min(keys, key=lambda k: (k[1], prefills[k[3]], k[2], k[3]))
            load_gap = best[1] - least[1]
            if load_gap > self.imbalance_threshold and (
                    prefills[least[3]] - best_prefill < load_gap):
                order.remove(least[3])
                order.insert(0, least[3])
                best_prefill = prefills[least[3]]
        best_id = ids[order[0]]
        self._routed_tokens[best_id] = (self._routed_tokens.get(best_id, 0.0) + best_prefill
                                        + query.max_tokens)
        return [ids[i] for i in order]
