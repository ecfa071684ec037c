"""Round robin over the candidates, in the order given: the load-blind baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.core.policies.base import ReplicaView, RouteQuery

if TYPE_CHECKING:
    from router.core.config import RouterConfig


class RoundRobinPolicy:
    name = "round_robin"
    uses_index = False

    def __init__(self, config: RouterConfig):
        self._num_routed = 0

    def choose(self, query: RouteQuery, view: ReplicaView) -> str:
        rid = query.replica_ids[self._num_routed % len(query.replica_ids)]
        self._num_routed += 1
        return rid
