"""Uniformly random candidate from a seeded generator: the floor every policy must beat. The
ranking is the candidates from the drawn one on, wrapping around."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from router.core.policies.base import RankingPolicy, ReplicaView, RouteQuery

if TYPE_CHECKING:
    from router.core.config import RouterConfig


class RandomPolicy(RankingPolicy):
    name = "random"
    uses_index = False

    def __init__(self, config: RouterConfig):
        self._rng = random.Random(config.seed)

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        ids = list(query.replica_ids)
        first = self._rng.randrange(len(ids))
        return ids[first:] + ids[:first]
