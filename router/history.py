"""Approximate mode: what each replica probably holds, from this router's own routing.

Without KV events, a routed request's blocks are assumed cached on its replica. Each replica
gets an LRU of at most `capacity_blocks` blocks whose entries expire `ttl_s` after they were
last routed. It is a baseline on its own and the fallback when the index actor is
unreachable or stale, so the router records into it on every decision to keep it warm.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from kv.hashing import BlockHash
from router.index import PrefixIndex, PrefixMatch


class RoutedHistory:
    def __init__(self, capacity_blocks: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic):
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self.capacity_blocks = capacity_blocks
        self.ttl_s = ttl_s
        self.clock = clock
        self.index = PrefixIndex(clock=clock)  # device medium only; no pending marks
        # replica -> hash -> expires_at, least recently routed first (so also soonest expiry)
        self._lru: dict[str, OrderedDict[BlockHash, float]] = {}

    def record(self, replica_id: str, block_hashes: Sequence[BlockHash]) -> None:
        """The prompt's blocks are now assumed cached on the replica."""
        now = self.clock()
        lru = self._lru.get(replica_id)
        if lru is None:
            lru = self._lru[replica_id] = OrderedDict()
        self._expire(replica_id, lru, now)
        expires_at = now + self.ttl_s
        new: list[BlockHash] = []
        # Tail first, so the head of the prompt is the most recent entry: the engine frees
        # a prompt's blocks tail first and evicts its shared head last; mirror that.
        for h in reversed(block_hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                new.append(h)
            lru[h] = expires_at
        self.index.add_blocks(replica_id, "device", new)
        if len(lru) > self.capacity_blocks:
            evicted = [lru.popitem(last=False)[0]
                       for _ in range(len(lru) - self.capacity_blocks)]
            self.index.remove_blocks(replica_id, "device", evicted)

    def match(self, block_hashes: Sequence[BlockHash], replica_ids: Iterable[str]
              ) -> dict[str, PrefixMatch]:
        now = self.clock()
        for rid, lru in self._lru.items():
            self._expire(rid, lru, now)
        return self.index.match(block_hashes, replica_ids)

    def _expire(self, replica_id: str, lru: OrderedDict[BlockHash, float], now: float) -> None:
        expired: list[BlockHash] = []
        for h, expires_at in lru.items():
            if expires_at > now:
                break
            expired.append(h)
        if expired:
            for h in expired:
                del lru[h]
            self.index.remove_blocks(replica_id, "device", expired)

    def remove_replica(self, replica_id: str) -> None:
        self._lru.pop(replica_id, None)
        self.index.remove_replica(replica_id)

    def num_blocks(self) -> int:
        return self.index.num_blocks("device")

    def check_invariants(self) -> None:
        self.index.check_invariants()
        assert set(self._lru) == set(self.index.replica_ids), "history replicas drifted"
        for rid, lru in self._lru.items():
            assert len(lru) <= self.capacity_blocks, f"{rid} over capacity"
            assert set(lru) == self.index.blocks_of(rid, "device"), f"{rid} history != index"
            times = list(lru.values())
            assert times == sorted(times), f"{rid} LRU out of expiry order"
        assert self.index.num_blocks("host") == 0, "history has no host tier"
