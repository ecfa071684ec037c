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

Continuation affinity (RouterConfig.continuation_affinity): a conversation's next turn goes
where its last turn went unless its guard lets the cost move it (policies/continuation.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

from kv.hashing import BlockHash
from router.core.policies.base import RankingPolicy, ReplicaView, RouteQuery
from router.core.policies.continuation import ContinuationGuard, Continuations
from router.core.prefix_match import PrefixMatch, PrefixMatches

if TYPE_CHECKING:
    from router.core.config import RouterConfig


# Matches priced as arrays from this many on (~16 numpy calls, against ~0.5 us a match
# one by one)
_ARRAY_PRICING_FROM = 32
# Candidates scored in Python lists, not arrays, up to this many (a ranking of 2: 5.0
# against 11.9 us with published stats, 4.5 against 7.4 without; even at about 10 without
# stats, 24 with)
_SCORED_IN_PYTHON = 8


class CacheAwarePolicy(RankingPolicy):
    name = "cache_aware"
    uses_index = True

    def __init__(self, config: RouterConfig,
                 continuation_guard: ContinuationGuard | None = None):
        self.block_size = config.block_size
        self.load_weight = config.load_weight
        self.host_cost_fraction = config.host_cost_fraction
        self.imbalance_threshold = config.imbalance_threshold
        # Work routed so far per replica (prefill cost + max_tokens): the last tie-break, so
        # that candidates equal on cost and load (all idle) do not all go to the first one.
        self._routed_tokens: dict[str, float] = {}
        self._listed_ids: tuple[str, ...] = ()  # the last candidates ranked, and where each
        self._listed_positions: dict[str, int] = {}  # sits in that list
        # where recent prompts went (continuation affinity on; guard: its defaults if None)
        self.continuations = (Continuations(continuation_guard or ContinuationGuard())
                              if config.continuation_affinity else None)

    def prefill_cost_tokens(self, match: PrefixMatch | None, num_prompt_tokens: int) -> float:
        """Tokens of prefill the request costs on a replica with this cached prefix."""
        if match is None:
            return float(num_prompt_tokens)
        device_tokens, host_tokens = match.hit_tokens(self.block_size, num_prompt_tokens)
        return (num_prompt_tokens - device_tokens - host_tokens
                + self.host_cost_fraction * host_tokens)

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        """Candidates by (cost, load, work routed so far, listed order); the imbalance guard
        may put the least loaded one first. Scored as arrays: at hundreds of candidates a
        Python key per candidate cost more than the rest of the decision's scoring; a few
        in Python, where the arrays' dozen numpy calls cost more."""
        ids = query.replica_ids
        n = len(ids)
        if n <= _SCORED_IN_PYTHON:
            loads, prefills, routed = self._scores_in_python(query, view)
            costs = [p + self.load_weight * x for p, x in zip(prefills, loads)]
            order = sorted(range(n), key=lambda i: (costs[i], loads[i], routed[i]))
            if self.imbalance_threshold != math.inf or self.continuations is not None:
                # (the guard and the continuations read arrays)
                loads, prefills, routed = np.array(loads), np.array(prefills), np.array(routed)
        else:
            loads, prefills, routed = self._scores(query, view)
            costs = prefills + self.load_weight * loads
            order = np.lexsort((routed, loads, costs)).tolist()  # stable: ties keep listed order
        best = order[0]
        # the least loaded candidate has the least load: its tie-breaks are only worth
        # sorting for when the gap to it is over the threshold
        if (self.imbalance_threshold != math.inf
                and loads[best] - loads.min() > self.imbalance_threshold):
            least = int(np.lexsort((routed, prefills, loads))[0])
            load_gap = loads[best] - loads[least]
            if load_gap > self.imbalance_threshold and (
                    prefills[least] - prefills[best] < load_gap):
                order.remove(least)
                order.insert(0, least)
                best = least
        if self.continuations is not None:
            kept = self.continuations.follow(query.block_hashes, query.num_prompt_tokens, ids,
                                             loads, best, prefills, self.load_weight)
            if kept != best:
                order.remove(kept)
                order.insert(0, kept)
                best = kept
        best_id = ids[best]
        self._routed_tokens[best_id] = (self._routed_tokens.get(best_id, 0.0)
                                        + float(prefills[best]) + query.max_tokens)
        return list(map(ids.__getitem__, order))

    def _scores(self, query: RouteQuery, view: ReplicaView
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every candidate's (load, prefill cost, work routed so far), as arrays."""
        ids = query.replica_ids
        n = len(ids)
        loads = (view.loads(ids) if view.loads is not None
                 else np.fromiter(map(view.load, ids), np.float64, n))
        prefills = np.empty(n)  # (np.full: ~2 us of Python-level dispatch more)
        prefills.fill(float(query.num_prompt_tokens))
        matches = view.matches
        if isinstance(matches, PrefixMatches) and len(matches) >= _ARRAY_PRICING_FROM:
            positions = list(map(self._positions(ids).get, matches.replica_ids, repeat(-1)))
            at = np.array(positions, np.int64)
            num_prompt_tokens = query.num_prompt_tokens
            device_blocks, cached_blocks = matches.device_blocks, matches.cached_blocks
            if -1 in positions:  # the index answers for candidates only; kept general
                listed = at >= 0
                at, device_blocks, cached_blocks = (
                    at[listed], device_blocks[listed], cached_blocks[listed])
            host_blocks = cached_blocks - device_blocks
            # PrefixMatch.hit_tokens and prefill_cost_tokens, on every match at once
            device_tokens = np.minimum(device_blocks * self.block_size, num_prompt_tokens)
            host_tokens = np.minimum(host_blocks * self.block_size,
                                     num_prompt_tokens - device_tokens)
            prefills[at] = (num_prompt_tokens - device_tokens - host_tokens
                            + self.host_cost_fraction * host_tokens)
        elif matches:  # a few: one by one costs less than the array calls
            self._price(prefills, query, matches)
        routed = np.fromiter(map(self._routed_tokens.get, ids, repeat(0.0)), np.float64, n)
        return loads, prefills, routed

    def _scores_in_python(self, query: RouteQuery, view: ReplicaView
                          ) -> tuple[list[float], list[float], list[float]]:
        """`_scores` of a few candidates, as lists."""
        ids = query.replica_ids
        loads = (view.loads(ids).tolist() if view.loads is not None
                 else list(map(view.load, ids)))
        prefills = [float(query.num_prompt_tokens)] * len(ids)
        if view.matches:
            self._price(prefills, query, view.matches)
        return loads, prefills, list(map(self._routed_tokens.get, ids, repeat(0.0)))

    def _price(self, prefills: np.ndarray | list[float], query: RouteQuery,
               matches: Mapping[str, PrefixMatch]) -> None:
        """Writes each candidate match's prefill cost at its place in `prefills`, one by
        one."""
        positions = self._positions(query.replica_ids)
        for rid, match in matches.items():
            i = positions.get(rid)
            if i is not None:
                prefills[i] = self.prefill_cost_tokens(match, query.num_prompt_tokens)

    def moved(self, block_hashes: Sequence[BlockHash], replica_id: str) -> None:
        if self.continuations is not None:
            self.continuations.moved(block_hashes, replica_id)

    def _positions(self, ids: Sequence[str]) -> dict[str, int]:
        """Each candidate's position in `ids`, kept while the candidates stay the same."""
        key = tuple(ids)
        if key != self._listed_ids:
            self._listed_ids = key
            self._listed_positions = {rid: i for i, rid in enumerate(key)}
        return self._listed_positions
