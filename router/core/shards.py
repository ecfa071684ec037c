"""The pooled bound online: SHARDS sampling and reuse distances (Waldspurger et al., FAST '15).

The pooled bound is the hit ratio of one LRU cache holding every replica's blocks, serving
the same requests in the same order (benchmarks/simlib/pooled.py computes it exactly,
offline). Online, a router keeps a block access only when the block's hash falls below
R x 2^64 (spatial sampling: a block is either always sampled or never, so its reuses are
kept whole), and one place replays the sampled accesses through `ReuseDistances`: the
number of distinct sampled blocks touched since a block's previous access, divided by R,
estimates its LRU stack distance, so one pass gives the hit ratio at every capacity.

Block hashes are xxh3_128 digests (kv/hashing.py), uniform, so their first 8 bytes read
big-endian are a uniform 64-bit number and `hash < threshold` compares bytes directly:
a 16-byte hash is below an 8-byte threshold exactly when its first 8 bytes are.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from fractions import Fraction

from sortedcontainers import SortedList

from kv.hashing import BlockHash

_ABOVE_EVERY_HASH = b"\xff" * 17  # sorts after every 16-byte digest: R = 1 keeps all


def sample_threshold(sample_rate: float) -> bytes:
    """The bytes a block hash must sort below to be sampled at `sample_rate` (0 < R <= 1)."""
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    # the rate as written ("0.01"), not its binary float: R x 2^64 exactly
    bound = math.floor(Fraction(repr(float(sample_rate))) * 2**64)
    if bound >= 2**64:
        return _ABOVE_EVERY_HASH
    return bound.to_bytes(8, "big")


def sampled_hashes(block_hashes: Sequence[BlockHash], threshold: bytes) -> list[BlockHash]:
    """The hashes below `threshold`, in order."""
    return [h for h in block_hashes if h < threshold]


def ladder_rate(base_rate: float, level: int) -> float:
    """The sample rate `level` doublings above `base_rate`: R x 2^level. Every process
    computes a level's rate with this one expression, so equal levels give equal floats and
    the thresholds nest (a hash kept at one level is kept at every higher one)."""
    return base_rate * 2**level


def rate_level(base_rate: float, sample_rate: float, max_level: int) -> int | None:
    """The highest level <= `max_level` whose rate is at most `sample_rate` (hashes sampled
    at `sample_rate` can be thinned to it); None when `sample_rate` is below `base_rate`."""
    if sample_rate < base_rate:
        return None
    level = max_level
    while ladder_rate(base_rate, level) > sample_rate:
        level -= 1
    return level


class ReuseDistances:
    """The sampled blocks in last-access order, and how far back each one was touched.

    `lookup(h)` is the number of distinct tracked blocks touched after h's last touch (its
    LRU stack distance in sampled blocks), or None when h was never touched or was
    forgotten. At most `max_blocks` blocks are tracked: touching one more forgets the least
    recently touched, which is then cold at its next access (so "infinite" capacity means
    `max_blocks / R` blocks).

    Last-access times live in a `SortedList`, so a distance is one bisection: O(log n).
    """

    def __init__(self, max_blocks: int):
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.max_blocks = max_blocks
        self._last_touch: OrderedDict[BlockHash, int] = OrderedDict()  # least recent first
        self._touch_times = SortedList()
        self._clock = 0

    def __len__(self) -> int:
        return len(self._last_touch)

    def lookup(self, block_hash: BlockHash) -> int | None:
        last = self._last_touch.get(block_hash)
        if last is None:
            return None
        times = self._touch_times
        return len(times) - times.bisect_right(last)

    def touch(self, block_hash: BlockHash) -> None:
        """Makes the block the most recently touched."""
        last_touch = self._last_touch
        last = last_touch.pop(block_hash, None)
        times = self._touch_times
        if last is not None:
            times.remove(last)
        self._clock += 1
        last_touch[block_hash] = self._clock
        times.add(self._clock)
        if len(last_touch) > self.max_blocks:
            last_touch.popitem(last=False)
            times.pop(0)

    def keep_below(self, threshold: bytes) -> None:
        """Forgets every tracked block whose hash is not below `threshold`: after the sample
        rate is lowered, what is left is what the lower rate would have tracked, and each
        distance counts blocks at the lower rate (SHARDS's fixed-size variant)."""
        kept = [(h, t) for h, t in self._last_touch.items() if h < threshold]
        self._last_touch = OrderedDict(kept)
        self._touch_times = SortedList(t for _, t in kept)

    def check_invariants(self) -> None:
        assert len(self._last_touch) == len(self._touch_times) <= self.max_blocks
        assert list(self._last_touch.values()) == list(self._touch_times), "orders differ"


def serve_prompt(reuse: ReuseDistances, sampled: Sequence[BlockHash]) -> list[int | None]:
    """Looks a prompt's sampled blocks up, then touches them tail first.

    As `PooledLRU.serve_prompt`: every block is looked up before any is cached, and the
    head ends most recent (a shared head outlives the tails hanging off it). Returns the
    reuse distance of each sampled block in prompt order (None: cold).
    """
    distances = [reuse.lookup(h) for h in sampled]
    for h in reversed(sampled):
        reuse.touch(h)
    return distances


def release(reuse: ReuseDistances, sampled: Sequence[BlockHash]) -> None:
    """A finished sequence's sampled blocks, cached again tail first."""
    for h in reversed(sampled):
        reuse.touch(h)
