"""Pure greedy longest match (ties to the least loaded): the counter-example baseline.

Kept to measure against: when every request shares its first block, the replica that
cached it first matches every later request best, and all traffic piles onto it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.core.policies.base import RankingPolicy, ReplicaView, RouteQuery

if TYPE_CHECKING:
    from router.core.config import RouterConfig


class LongestPrefixPolicy(RankingPolicy):
    name = "longest_prefix"
    uses_index = True

    def __init__(self, config: RouterConfig):
        pass

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        """Most cached blocks first, then least load, then the listed order."""
        matches, load = view.matches, view.load
        keys = []
        for i, rid in enumerate(query.replica_ids):
            m = matches.get(rid)
            keys.append((-(m.num_cached_blocks if m else 0), load(rid), i))
        keys.sort()
        return [query.replica_ids[i] for _, _, i in keys]
