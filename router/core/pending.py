"""Pending marks: blocks a router just sent to a replica, before any event confirms them.

A request routed to replica slot s marks its blocks pending on s at once, so the requests of
a burst that share its prefix follow it before the replica has published anything. A mark
is held while its request is outstanding: a request can wait in a long queue before its
prefill runs and its events arrive, and a mark that expired meanwhile would scatter the
requests that share its prefix. A mark ends when an event confirms the block on s (device),
or `ttl_s` after the last request holding it finished (its events may still be on their
way), so a request that never ran (failed, aborted) stops attracting traffic. Marks set
with `mark` are held by no request and expire `ttl_s` after they were set.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import compress, repeat
from operator import ge, sub

from kv.hashing import BlockHash
from router.core.hash_loops import delete_keys, keys_stamped


class PendingMarks:
    """Per replica, the block hashes pending there and when each mark expires.

    A replica is named by its device bit in the index's bitmasks. Marks are kept per
    replica, not in one hash -> bitmask dict: the walk asks about them only when a replica's
    confirmed device run is about to end, while marking and expiring (every decision,
    hundreds of hashes) become bulk updates of small per-replica dicts. A mark's value is
    its expiry time (> 0), or minus the number of outstanding requests holding it. Timed
    marks expire in the order they were set (one TTL for all), so expiry pops a FIFO.
    """

    def __init__(self, ttl_s: float):
        if not ttl_s > 0:
            raise ValueError(f"pending ttl_s must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        # replica bit -> {hash: expires_at > 0, or -holders}; a replica's latest timed mark
        # of a hash wins, queue entries of earlier ones are stale and skipped
        self.by_bit: dict[int, dict[BlockHash, float]] = {}
        self.bits_mask = 0  # bits of the replicas with at least one mark
        self._queue: deque[tuple[float, int, tuple[BlockHash, ...]]] = deque()

    def __len__(self) -> int:
        """Number of (block hash, replica) marks."""
        return sum(len(d) for d in self.by_bit.values())

    def marked(self, bit: int) -> frozenset[BlockHash]:
        return frozenset(self.by_bit.get(bit, ()))

    def mark(self, bit: int, block_hashes: Sequence[BlockHash], now: float) -> None:
        """Marks blocks for `ttl_s` from now (blocks held by a request stay held)."""
        mine = self.by_bit.get(bit)
        hashes = (tuple(compress(block_hashes, map(ge, map(mine.get, block_hashes,
                                                           repeat(0.0)), repeat(0.0))))
                  if mine else tuple(block_hashes))
        self._stamp(bit, hashes, now + self.ttl_s)

    def hold(self, bit: int, block_hashes: Sequence[BlockHash]) -> None:
        """Marks blocks for a request until it `release`s them (no expiry meanwhile)."""
        if not block_hashes:
            return
        mine = self._mine(bit)
        if mine.keys().isdisjoint(block_hashes):  # the common case: all new marks
            mine.update(dict.fromkeys(block_hashes, -1.0))
            return
        # -1 for a new or timed mark, one more holder for a held one
        mine.update(zip(block_hashes, map(sub, map(min, map(mine.get, block_hashes,
                                                            repeat(0.0)), repeat(0.0)),
                                          repeat(1.0))))

    def release(self, bit: int, block_hashes: Sequence[BlockHash], now: float) -> None:
        """The request that `hold`s these blocks finished: the marks no other request holds
        expire `ttl_s` from now. Marks confirmed (or forgotten) meanwhile are gone already.
        Holders are counted, not named: if a block was confirmed, evicted and held again
        by a newer request meanwhile, this release starts its TTL early (rare, and only
        shortens a mark).
        """
        mine = self.by_bit.get(bit)
        if mine is None:
            return
        ended = []
        for h in block_hashes:
            n = mine.get(h)
            if n is None or n > 0:
                continue  # confirmed, or held no more
            if n < -1.0:
                mine[h] = n + 1.0
            else:
                ended.append(h)
        self._stamp(bit, ended, now + self.ttl_s)

    def _mine(self, bit: int) -> dict[BlockHash, float]:
        mine = self.by_bit.get(bit)
        if mine is None:
            mine = self.by_bit[bit] = {}
            self.bits_mask |= bit
        return mine

    def _stamp(self, bit: int, hashes: Sequence[BlockHash], expires_at: float) -> None:
        if hashes:
            hashes = tuple(hashes)
            self._mine(bit).update(dict.fromkeys(hashes, expires_at))
            self._queue.append((expires_at, bit, hashes))

    def expire(self, now: float) -> None:
        """Drops every timed mark whose TTL has run out (`expires_at <= now`)."""
        queue = self._queue
        while queue and queue[0][0] <= now:
            expires_at, bit, hashes = queue.popleft()
            mine = self.by_bit.get(bit)
            if mine is None:
                continue
            # marks refreshed, held or confirmed since carry another value, or none: they stay
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
            for h, value in mine.items():
                assert value != 0, f"mark {h.hex()} neither timed nor held"
                if value > 0:
                    assert (h, bit, value) in queued, f"mark {h.hex()} never expires"
                else:
                    assert value == int(value), f"mark {h.hex()}: {value} holders"
        assert self.bits_mask == bits, "pending bits mask != replicas with marks"
        times = [t for t, _, _ in self._queue]
        assert times == sorted(times), "pending queue out of expiry order"
