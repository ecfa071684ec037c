"""Uniformly random candidate from a seeded generator: the floor every policy must beat."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from router.core.policies.base import ReplicaView, RouteQuery

if TYPE_CHECKING:
    from router.core.config import RouterConfig


class RandomPolicy:
    name = "random"
    uses_index = False

    def __init__(self, config: RouterConfig):
        self._rng = random.Random(config.seed)

    def choose(self, query: RouteQuery, view: ReplicaView) -> str:
        return query.replica_ids[self._rng.randrange(len(query.replica_ids))]
