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
from router.bulk import delete_keys, keys_stamped


class PendingMarks:
    """Per replica, the block hashes pending there and when each mark expires.

    A replica is named by its device bit in the index's bitmasks. Marks are kept per
    replica, not in one hash -> bitmask dict: the walk asks about them only when a replica's
    confirmed device run is about to end, while marking and expiring (every decision,
    hundreds of hashes) become bulk updates of small per-replica dicts. Marks expire in the
    order they were set (one TTL for all), so expiry pops a FIFO.
    """

    def __init__(self, ttl_s: float):
        if not ttl_s > 0:
            raise ValueError(f"pending ttl_s must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        # replica bit -> {hash: expires_at}; a replica's latest mark of a hash wins, queue
        # entries of earlier marks of it are stale and skipped
        self.by_bit: dict[int, dict[BlockHash, float]] = {}
        self.bits_mask = 0  # bits of the replicas with at least one mark
        self._queue: deque[tuple[float, int, tuple[BlockHash, ...]]] = deque()

    def __len__(self) -> int:
        """Number of (block hash, replica) marks."""
        return sum(len(d) for d in self.by_bit.values())

    def marked(self, bit: int) -> frozenset[BlockHash]:
        return frozenset(self.by_bit.get(bit, ()))

    def mark(self, bit: int, block_hashes: Sequence[BlockHash], now: float) -> None:
        if not block_hashes:
            return
        hashes = tuple(block_hashes)
        expires_at = now + self.ttl_s
        mine = self.by_bit.get(bit)
        if mine is None:
            mine = self.by_bit[bit] = {}
            self.bits_mask |= bit
        mine.update(dict.fromkeys(hashes, expires_at))
        self._queue.append((expires_at, bit, hashes))

    def expire(self, now: float) -> None:
        """Drops every mark whose TTL has run out (`expires_at <= now`)."""
        queue = self._queue
        while queue and queue[0][0] <= now:
            expires_at, bit, hashes = queue.popleft()
            mine = self.by_bit.get(bit)
            if mine is None:
                continue
            # marks refreshed or confirmed since carry another expiry, or none: they stay
            delete_keys(mine, keys_stamped(mine, hashes, expires_at))
            if not mine:
                self._drop(bit)

    def confirm(self, bit: int, block_hashes: Sequence[BlockHash]) -> None:
        """The replica now holds these blocks on the device: their marks are done."""
        mine = self.by_bit.get(bit)
        if mine is None:
            return
        delete_keys(mine, [h for h in block_hashes if h in mine])
        if not mine:
            self._drop(bit)

    def forget(self, bit: int) -> None:
        """Drops all marks of a replica (it is gone; its bit may be reused)."""
        if bit in self.by_bit:
            self._drop(bit)
        self._queue = deque(entry for entry in self._queue if entry[1] != bit)

    def _drop(self, bit: int) -> None:
        del self.by_bit[bit]
        self.bits_mask &= ~bit

    def check_invariants(self) -> None:
        queued = {(h, bit, t) for t, bit, hashes in self._queue for h in hashes}
        bits = 0
        for bit, mine in self.by_bit.items():
            assert mine, f"empty pending entry for bit {bit:#x}"
            bits |= bit
            for h, expires_at in mine.items():
                assert (h, bit, expires_at) in queued, f"mark {h.hex()} never expires"
        assert self.bits_mask == bits, "pending bits mask != replicas with marks"
        times = [t for t, _, _ in self._queue]
        assert times == sorted(times), "pending queue out of expiry order"
