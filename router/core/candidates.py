"""The order a router lists the replicas in when it ranks them.

Policies keep the listed order among full ties (router/core/policies/cache_aware.py: a new
prefix on an idle fleet ties everywhere). Several routers that list the replicas alike
therefore all send their ties to the first replica, each blind to the others' choices until
the events or shared marks arrive. Each router instead lists them from its own offset, so
their ties fall on different replicas; one router alone only moves which replica its ties
start from. The list rotated is the live one: a dead replica is never listed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def rotated(replica_ids: Sequence[str], offset: int) -> list[str]:
    """`replica_ids` listed from position `offset` modulo their number, wrapping round."""
    ids = list(replica_ids)
    if not ids:
        return ids
    k = offset % len(ids)
    return ids[k:] + ids[:k]


def router_offset(router_id: str) -> int:
    """A router's offset, stable over its life and the same in every process: a hash of its
    id (a live router knows neither its index among the routers nor their number)."""
    return int.from_bytes(hashlib.blake2b(router_id.encode(), digest_size=8).digest(), "big")
