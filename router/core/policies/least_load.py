"""Least outstanding work (router.core.load), cache-blind: the load-balancing baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.core.policies.base import ReplicaView, RouteQuery, least_loaded

if TYPE_CHECKING:
    from router.core.config import RouterConfig


class LeastLoadPolicy:
    name = "least_load"
    uses_index = False

    def __init__(self, config: RouterConfig):
        pass

    def choose(self, query: RouteQuery, view: ReplicaView) -> str:
        return least_loaded(query.replica_ids, view.load)
