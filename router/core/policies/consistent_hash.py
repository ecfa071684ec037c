"""Rendezvous (highest random weight) hashing on the prompt's first blocks.

The key is the hash of block `hash_prefix_blocks - 1` (or the last full block of a shorter
prompt): chained hashes make it stand for the whole prefix up to there. Each candidate
scores xxh3_64(key + replica id) and the highest wins, so removing a replica moves only the
keys it owned, and adding one takes keys only from others, with no ring to maintain. A
prompt without a full block is keyed by its request id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import xxhash

from router.core.policies.base import ReplicaView, RouteQuery

if TYPE_CHECKING:
    from router.core.config import RouterConfig

_xxh3_64 = xxhash.xxh3_64_intdigest


class ConsistentHashPolicy:
    name = "consistent_hash"
    uses_index = False

    def __init__(self, config: RouterConfig):
        self.hash_prefix_blocks = config.hash_prefix_blocks
        self._id_bytes: dict[str, bytes] = {}

    def choose(self, query: RouteQuery, view: ReplicaView) -> str:
        hashes = query.block_hashes
        if hashes:
            key = hashes[min(self.hash_prefix_blocks, len(hashes)) - 1]
        else:
            key = query.request_id.encode()
        best_id, best_score = "", -1
        for rid in query.replica_ids:
            b = self._id_bytes.get(rid)
            if b is None:
                b = self._id_bytes[rid] = rid.encode()
            score = _xxh3_64(key + b"\x00" + b)
            if score > best_score:
                best_id, best_score = rid, score
        return best_id
