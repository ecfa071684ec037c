"""The order a router lists the replicas in when it ranks them.

Policies keep the listed order among full ties (router/core/policies/cache_aware.py: a new
prefix on an idle fleet ties everywhere). Several routers that list the replicas alike
therefore all send their ties to the first replica, each blind to the others' choices until
the events or shared marks arrive. Each router instead lists them from its own offset, so
their ties fall on different replicas; one router alone only moves which replica its ties
start from. The list rotated is the live one: a dead replica is never listed.

The offset: router i of G (its rank among the live routers the index actor knows, sorted by
id; each learns it with its index poll) starts i x N / G of the way round N replicas, so G
routers start evenly spread and never two on one replica while G <= N. A router that does
not know its rank yet (before its first poll) or knows itself alone starts at a hash of its
id, which needs nothing from outside but lets two routers of eight share a start.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple


class RouterRank(NamedTuple):
    """A router's place among the live routers, sorted by id: `rank` in [0, num_routers)."""

    rank: int
    num_routers: int


def rank_among(router_id: str, router_ids: Iterable[str]) -> RouterRank:
    """`router_id`'s rank among `router_ids` (itself counted even when missing there)."""
    ids = sorted(set(router_ids) | {router_id})
    return RouterRank(ids.index(router_id), len(ids))


def rotated(replica_ids: Sequence[str], offset: int) -> list[str]:
    """`replica_ids` listed from position `offset` modulo their number, wrapping round."""
    ids = list(replica_ids)
    if not ids:
        return ids
    k = offset % len(ids)
    return ids[k:] + ids[:k]


def router_offset(router_id: str) -> int:
    """A router's offset when it knows no rank: stable over its life and the same in every
    process, a hash of its id."""
    return int.from_bytes(hashlib.blake2b(router_id.encode(), digest_size=8).digest(), "big")


def list_offset(num_replicas: int, hashed_offset: int, rank: RouterRank | None) -> int:
    """Where a router lists `num_replicas` live replicas from: rank i of G at i x N / G;
    without a rank, or alone, at `hashed_offset` (its `router_offset`)."""
    if rank is None or rank.num_routers < 2:
        return hashed_offset
    return rank.rank * num_replicas // rank.num_routers
