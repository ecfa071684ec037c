"""Rendezvous (highest random weight) hashing on the prompt's first blocks.

The key is the hash of block `hash_prefix_blocks - 1` (or the last full block of a shorter
prompt): chained hashes make it stand for the whole prefix up to there. Each candidate
scores xxh3_64(key + replica id) and the highest wins (the ranking: by score, highest
first), so removing a replica moves only the keys it owned, and adding one takes keys only
from others, with no ring to maintain. A prompt without a full block is keyed by its
request id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import xxhash

from router.core.policies.base import RankingPolicy, ReplicaView, RouteQuery

if TYPE_CHECKING:
    from router.core.config import RouterConfig

_xxh3_64 = xxhash.xxh3_64_intdigest


class ConsistentHashPolicy(RankingPolicy):
    name = "consistent_hash"
    uses_index = False

    def __init__(self, config: RouterConfig):
        self.hash_prefix_blocks = config.hash_prefix_blocks
        self._id_bytes: dict[str, bytes] = {}

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        hashes = query.block_hashes
        if hashes:
            key = hashes[min(self.hash_prefix_blocks, len(hashes)) - 1]
        else:
            key = query.request_id.encode()
        scored = []
        for rid in query.replica_ids:
            b = self._id_bytes.get(rid)
            if b is None:
                b = self._id_bytes[rid] = rid.encode()
            scored.append((-_xxh3_64(key + b"\x00" + b), rid))
        scored.sort()
        return [rid for _, rid in scored]
