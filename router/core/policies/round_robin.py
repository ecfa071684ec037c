"""Round robin over the candidates, in the order given: the load-blind baseline. The ranking
is the candidates from this turn's one on, wrapping around."""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.core.policies.base import RankingPolicy, ReplicaView, RouteQuery

if TYPE_CHECKING:
    from router.core.config import RouterConfig


class RoundRobinPolicy(RankingPolicy):
    name = "round_robin"
    uses_index = False

    def __init__(self, config: RouterConfig):
        self._num_routed = 0

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        ids = list(query.replica_ids)
        first = self._num_routed % len(ids)
        self._num_routed += 1
        return ids[first:] + ids[:first]
