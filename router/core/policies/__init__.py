"""Routing policies, one per file, behind the `Policy` contract (router.core.policies.base).

`make_policy(name, config)` builds one by its `name`, the label its metrics carry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.core.policies.base import Policy, ReplicaView, RouteQuery
from router.core.policies.cache_aware import CacheAwarePolicy
from router.core.policies.consistent_hash import ConsistentHashPolicy
from router.core.policies.least_load import LeastLoadPolicy
from router.core.policies.longest_prefix import LongestPrefixPolicy
from router.core.policies.random_pick import RandomPolicy
from router.core.policies.round_robin import RoundRobinPolicy

if TYPE_CHECKING:
    from router.core.config import RouterConfig

_POLICIES = {
    p.name: p
    for p in (CacheAwarePolicy, RoundRobinPolicy, LeastLoadPolicy, RandomPolicy,
              ConsistentHashPolicy, LongestPrefixPolicy)
}
POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)


def make_policy(name: str, config: RouterConfig) -> Policy:
    """The policy called `name`, configured from `config`."""
    cls = _POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown routing policy {name!r}; choose one of "
                         f"{', '.join(POLICY_NAMES)}")
    return cls(config)


__all__ = [
    "POLICY_NAMES", "CacheAwarePolicy", "ConsistentHashPolicy", "LeastLoadPolicy",
    "LongestPrefixPolicy", "Policy", "RandomPolicy", "ReplicaView", "RoundRobinPolicy",
    "RouteQuery", "make_policy",
]
