"""Least outstanding work (router.core.load), cache-blind: the load-balancing baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.core.policies.base import RankingPolicy, ReplicaView, RouteQuery, by_load

if TYPE_CHECKING:
    from router.core.config import RouterConfig


class LeastLoadPolicy(RankingPolicy):
    name = "least_load"
    uses_index = False

    def __init__(self, config: RouterConfig):
        pass

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        return by_load(query.replica_ids, view.load)
