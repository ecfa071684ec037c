"""Pending marks: blocks a router just sent to a replica, before any event confirms them.

A request routed to replica slot s marks its blocks pending on s at once, so the requests of
a burst that share its prefix follow it before the replica has published anything. A mark
ends when an event confirms the block on s (device) or when it expires `ttl_s` after it was
last set, so a request that never ran (failed, aborted) stops attracting traffic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from kv.hashing import BlockHash


class PendingMarks:
    """Per block hash, a bitmask of the replica slots it is pending on.

    `mask` is read directly by the index walk; everything else keeps it consistent.
    Marks expire in the order they were set (one TTL for all), so expiry pops a FIFO.
    """

    def __init__(self, ttl_s: float):
        if not ttl_s > 0:
            raise ValueError(f"pending ttl_s must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        self.mask: dict[BlockHash, int] = {}
        # hash -> {slot: expires_at}; a slot's latest mark wins, older queue entries are stale
        self._expires_at: dict[BlockHash, dict[int, float]] = {}
        self._queue: deque[tuple[float, int, tuple[BlockHash, ...]]] = deque()

    def __len__(self) -> int:
        """Number of (block hash, slot) marks."""
        return sum(len(d) for d in self._expires_at.values())

    def mark(self, slot: int, block_hashes: Sequence[BlockHash], now: float) -> None:
        if not block_hashes:
            return
        expires_at = now + self.ttl_s
        bit = 1 << slot
        mask, expires = self.mask, self._expires_at
        for h in block_hashes:
            d = expires.get(h)
            if d is None:
                expires[h] = {slot: expires_at}
                mask[h] = bit
            else:
                d[slot] = expires_at
                mask[h] |= bit
        self._queue.append((expires_at, slot, tuple(block_hashes)))

    def expire(self, now: float) -> None:
        """Drops every mark whose TTL has run out (`expires_at <= now`)."""
        queue = self._queue
        while queue and queue[0][0] <= now:
            expires_at, slot, block_hashes = queue.popleft()
            for h in block_hashes:
                d = self._expires_at.get(h)
                if d is not None and d.get(slot) == expires_at:
                    self._drop(h, d, slot)

    def confirm(self, slot: int, block_hashes: Sequence[BlockHash]) -> None:
        """The replica in `slot` now holds these blocks on the device: their marks are done."""
        if not self._expires_at:
            return
        expires = self._expires_at
        for h in block_hashes:
            d = expires.get(h)
            if d is not None and slot in d:
                self._drop(h, d, slot)

    def forget_slot(self, slot: int) -> None:
        """Drops all marks of a slot (its replica is gone; the slot may be reused)."""
        kept = deque()
        for entry in self._queue:
            if entry[1] == slot:
                for h in entry[2]:
                    d = self._expires_at.get(h)
                    if d is not None and slot in d:
                        self._drop(h, d, slot)
            else:
                kept.append(entry)
        self._queue = kept

    def _drop(self, h: BlockHash, d: dict[int, float], slot: int) -> None:
        del d[slot]
        if d:
            self.mask[h] &= ~(1 << slot)
        else:
            del self._expires_at[h]
            del self.mask[h]

    def check_invariants(self) -> None:
        assert self.mask.keys() == self._expires_at.keys(), "pending mask and marks disagree"
        queued = {(h, slot, t) for t, slot, hashes in self._queue for h in hashes}
        for h, d in self._expires_at.items():
            assert d, f"empty pending entry for {h.hex()}"
            bits = 0
            for slot, expires_at in d.items():
                bits |= 1 << slot
                assert (h, slot, expires_at) in queued, f"mark {h.hex()}@{slot} never expires"
            assert self.mask[h] == bits, f"pending mask of {h.hex()} != its marks"
        times = [t for t, _, _ in self._queue]
        assert times == sorted(times), "pending queue out of expiry order"
