"""Pure greedy longest match (ties to the least loaded): the counter-example baseline.

Kept to measure against: when every request shares its first block, the replica that
cached it first matches every later request best, and all traffic piles onto it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.core.policies.base import ReplicaView, RouteQuery

if TYPE_CHECKING:
    from router.core.config import RouterConfig


class LongestPrefixPolicy:
    name = "longest_prefix"
    uses_index = True

    def __init__(self, config: RouterConfig):
        pass

    def choose(self, query: RouteQuery, view: ReplicaView) -> str:
        matches, load = view.matches, view.load
        best_id, best_key = query.replica_ids[0], (0, 0.0)
        for i, rid in enumerate(query.replica_ids):
            m = matches.get(rid)
            key = (-(m.num_cached_blocks if m else 0), load(rid))
            if i == 0 or key < best_key:
                best_id, best_key = rid, key
        return best_id
