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

import math
from collections import deque
from collections.abc import Sequence
from itertools import compress, repeat
from operator import eq, is_not, ne

from kv.hashing import BlockHash
from router.core.hash_loops import delete_keys, keys_stamped

# A held mark expires at no time until its last holder releases it.
_NEVER = math.inf


class PendingMarks:
    """Per replica, the block hashes pending there and when each mark expires.

    A replica is named by its device bit in the index's bitmasks. Marks are kept per
    replica, not in one hash -> bitmask dict: the walk asks about them only when a replica's
    confirmed device run is about to end, while marking and expiring (every decision,
    hundreds of hashes) become bulk updates of small per-replica dicts. A mark's value is
    when it expires: `ttl_s` after it was set, or never (inf) while a request holds it. A
    block held by several requests at once (rare: they share a prefix nobody confirmed
    yet) counts its holders beyond the first apart, so the common hold is one dict update.
    Timed marks expire in the order they were set (one TTL for all), so expiry pops a FIFO.
    """

    def __init__(self, ttl_s: float):
        if not ttl_s > 0:
            raise ValueError(f"pending ttl_s must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        # replica bit -> {hash: expires_at_s}; a replica's latest timed mark of a hash wins,
        # queue entries of earlier ones are stale and skipped
        self.by_bit: dict[int, dict[BlockHash, float]] = {}
        self.bits_mask = 0  # bits of the replicas with at least one mark
        # replica bit -> {hash: holders of a held mark beyond the first (>= 1)}
        self._more_holders: dict[int, dict[BlockHash, int]] = {}
        # (expires at, replica bit, hashes): the hashes include every mark stamped then
        self._queue: deque[tuple[float, int, tuple[BlockHash, ...]]] = deque()
        # (the bits of `by_bit`, their dicts), built when asked and kept until a replica
        # gains its first mark or loses its last: a walk asks every replica's dict at once
        self._listed: tuple[tuple[int, ...], tuple[dict[BlockHash, float], ...]] | None = None

    def __len__(self) -> int:
        """Number of (block hash, replica) marks."""
        return sum(len(d) for d in self.by_bit.values())

    def listed(self) -> tuple[tuple[int, ...], tuple[dict[BlockHash, float], ...]]:
        """(the bits of the replicas with marks, the dict of each), in one order."""
        if self._listed is None:
            self._listed = (tuple(self.by_bit), tuple(self.by_bit.values()))
        return self._listed

    def marked(self, bit: int) -> frozenset[BlockHash]:
        return frozenset(self.by_bit.get(bit, ()))

    def mark(self, bit: int, block_hashes: Sequence[BlockHash], now: float) -> None:
        """Marks blocks for `ttl_s` from now (blocks held by a request stay held)."""
        mine = self.by_bit.get(bit)
        hashes = (tuple(compress(block_hashes, map(ne, map(mine.get, block_hashes),
                                                   repeat(_NEVER))))
                  if mine else tuple(block_hashes))
        self._stamp(bit, hashes, now + self.ttl_s)

    def hold(self, bit: int, block_hashes: Sequence[BlockHash]) -> None:
        """Marks blocks for a request until it `release`s them (no expiry meanwhile)."""
        if not block_hashes:
            return
        mine = self._mine(bit)
        num_marks = len(mine)
        # One pass inserts the absent hashes (the common hold: a prompt's uncached blocks)
        # and returns what the others held. The value is a new inf, so that a hash found
        # held (the module's inf) tells apart from one inserted by this pass; both mean
        # "held" to every comparison (inf == inf).
        inserted = float("inf")
        found = list(map(mine.setdefault, block_hashes, repeat(inserted)))
        if len(mine) - num_marks == len(block_hashes):
            return  # every hash was absent
        # the hashes found marked, and their marks then (C-speed passes: a prompt routed
        # again to a replica still computing its blocks finds hundreds)
        found_hashes = list(compress(block_hashes, map(is_not, found, repeat(inserted))))
        found_marks = list(compress(found, map(is_not, found, repeat(inserted))))
        held = list(compress(found_hashes, map(eq, found_marks, repeat(_NEVER))))
        if len(held) != len(found_hashes):  # timed marks: held from now on
            mine.update(zip(compress(found_hashes, map(ne, found_marks, repeat(_NEVER))),
                            repeat(inserted)))
        if held:  # held already: one more holder each
            more = self._more_holders.setdefault(bit, {})
            for h in held:
                more[h] = more.get(h, 0) + 1

    def release(self, bit: int, block_hashes: Sequence[BlockHash], now: float,
                withdraw: bool = False) -> None:
        """The request that `hold`s these blocks finished: the marks no other request holds
        expire `ttl_s` from now, or at once with `withdraw` (the request never went there:
        it was retried or sent elsewhere, so no event of it will come). Marks confirmed (or
        forgotten) meanwhile are gone already. Holders are counted, not named: if a block
        was confirmed, evicted and held again by a newer request meanwhile, this release
        starts its TTL early (rare, and only shortens a mark).
        """
        mine = self.by_bit.get(bit)
        if mine is None:
            return
        held = keys_stamped(mine, block_hashes, _NEVER)
        more = self._more_holders.get(bit)
        if more:
            ended = []
            for h in held:
                n = more.pop(h, 0)
                if n > 1:
                    more[h] = n - 1
                elif n == 0:
                    ended.append(h)
            held = ended
        if withdraw:
            delete_keys(mine, held)
            if not mine:
                self._drop(bit)
        elif held:
            # The queue keeps the caller's sequence (the request's held hashes, a superset
            # of those stamped now: expiry deletes only marks stamped with its time), not a
            # copy: one container of hundreds of hashes less for the cyclic collector to
            # walk per decision.
            expires_at = now + self.ttl_s
            mine.update(dict.fromkeys(held, expires_at))
            self._queue.append((expires_at, bit, block_hashes if isinstance(block_hashes, tuple)
                                else tuple(held)))

    def _mine(self, bit: int) -> dict[BlockHash, float]:
        mine = self.by_bit.get(bit)
        if mine is None:
            mine = self.by_bit[bit] = {}
            self.bits_mask |= bit
            self._listed = None
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
            # marks refreshed, held or confirmed since carry another value, or none: they
            # stay (not popped and put back: at 256 replicas the dicts' churn cost more
            # than the pass it saved)
            delete_keys(mine, keys_stamped(mine, hashes, expires_at))
            if not mine:
                self._drop(bit)

    def confirm(self, bit: int, block_hashes: Sequence[BlockHash]) -> None:
        """The replica now holds these blocks on the device: their marks are done."""
        mine = self.by_bit.get(bit)
        if mine is None:
            return
        gone = [h for h in block_hashes if h in mine]
        delete_keys(mine, gone)
        more = self._more_holders.get(bit)
        if more:
            for h in gone:
                more.pop(h, None)
        if not mine:
            self._drop(bit)

    def forget(self, bit: int) -> None:
        """Drops all marks of a replica (it is gone; its bit may be reused)."""
        if bit in self.by_bit:
            self._drop(bit)
        self._queue = deque(entry for entry in self._queue if entry[1] != bit)

    def _drop(self, bit: int) -> None:
        del self.by_bit[bit]
        self._more_holders.pop(bit, None)
        self.bits_mask &= ~bit
        self._listed = None

    def check_invariants(self) -> None:
        queued = {(h, bit, t) for t, bit, hashes in self._queue for h in hashes}
        bits = 0
        for bit, mine in self.by_bit.items():
            assert mine, f"empty pending entry for bit {bit:#x}"
            bits |= bit
            for h, expires_at in mine.items():
                assert expires_at > 0, f"mark {h.hex()} expires at {expires_at}"
                if expires_at != _NEVER:
                    assert (h, bit, expires_at) in queued, f"mark {h.hex()} never expires"
        for bit, more in self._more_holders.items():
            mine = self.by_bit.get(bit, {})
            for h, n in more.items():
                assert n >= 1, f"mark {h.hex()}: {n} more holders"
                assert mine.get(h) == _NEVER, f"mark {h.hex()} has holders but is not held"
        assert self.bits_mask == bits, "pending bits mask != replicas with marks"
        if self._listed is not None:
            assert self._listed == (tuple(self.by_bit), tuple(self.by_bit.values())), (
                "listed marks != replicas with marks")
        times = [t for t, _, _ in self._queue]
        assert times == sorted(times), "pending queue out of expiry order"
