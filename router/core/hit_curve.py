"""The pooled LRU hit ratio at any capacity, since start and over a recent window.

Fed the sampled accesses of every router (router/core/shards.py), it keeps, per time bucket,
how many sampled lookups came back at each reuse distance (in sampled blocks), how many
were cold, and the exact totals the routers counted without sampling: blocks looked up
and prompt tokens. A lookup hits a pooled LRU of C blocks when its distance / R < C.

The hit ratio in tokens at capacity C is

    (H(C) / S) x (B x N) / T

H(C) sampled lookups that hit, S sampled lookups, N all blocks looked up, B tokens a block,
T prompt tokens: the sampled hit fraction applied to the exact count of full-block tokens.
Dividing by the sample's own size rather than by R x N (plain SHARDS) cancels the luck of
how many blocks the hash threshold happened to keep (the SHARDS_adj correction's aim). It
leaves out the engine's rule that a fully cached prompt computes its last token (one token
a fully cached prompt: < 0.1% of a 1,000-token prompt).

The sample rate follows the fleet's size. At a fixed R the curve's position is read off
about C x R sampled blocks: at R = 0.01 a fleet of 16,384 blocks puts 82 of them under its
0.5x rung, and where the curve is steep (a working set that just fits) the sample's luck
moved the hit ratio by up to 0.08. So the rate starts at R x 2^k (k <= max_rate_doublings)
and, once the fleet's capacity C is known, halves until R_t x C <= capacity_sampled_blocks,
never below R: every fleet's 1x rung holds a few thousand sampled blocks, and the actor's
work (R_t x the fleet's block accesses) stays near constant as fleets grow. Lowering the
rate drops the tracked blocks above the new threshold (SHARDS's fixed-size variant, whose
trigger, the distinct blocks seen since start, only grows in a live fleet: its rate would
end at R within hours). A lookup sampled at R_t stands for 1 / R_t lookups, so the counts of
each rate are weighed by 1 / R_t (the paper rescales old counts by R_new / R_old: the same).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from kv.hashing import BlockHash
from router.core.shards import (
    ReuseDistances,
    ladder_rate,
    rate_level,
    release,
    sample_threshold,
    sampled_hashes,
    serve_prompt,
)

WINDOWS = ("recent", "all")


@dataclass(frozen=True)
class HitCurveConfig:
    # R: the sparsest sample, the fraction of block hashes a large fleet's routers sample
    sample_rate: float = 0.01
    # the sample starts at R x 2^k (the largest <= 1, k <= this) and halves, never below
    # R, while the fleet's device capacity in blocks x the rate exceeds the next setting
    max_rate_doublings: int = 6
    capacity_sampled_blocks: int = 8192  # sampled blocks wanted within 1x capacity
    # sampled blocks tracked; the least recent is forgotten beyond it, so "infinite"
    # capacity means max_sampled_blocks / R_t blocks (26M at R_t = 0.01)
    max_sampled_blocks: int = 1 << 18
    recent_window_s: float = 600.0  # the "recent" window (the last N minutes)
    num_buckets: int = 10  # the recent window moves in steps of recent_window_s / num_buckets

    def __post_init__(self):
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate}")
        if not 0 <= self.max_rate_doublings <= 20:  # weights 2^level stay in int64
            raise ValueError(f"max_rate_doublings must be in [0, 20], got "
                             f"{self.max_rate_doublings}")
        if self.capacity_sampled_blocks < 1:
            raise ValueError(f"capacity_sampled_blocks must be >= 1, got "
                             f"{self.capacity_sampled_blocks}")
        if self.max_sampled_blocks < 1:
            raise ValueError(f"max_sampled_blocks must be >= 1, got {self.max_sampled_blocks}")
        if not (math.isfinite(self.recent_window_s) and self.recent_window_s > 0):
            raise ValueError(f"recent_window_s must be finite and > 0, got "
                             f"{self.recent_window_s}")
        if self.num_buckets < 1:
            raise ValueError(f"num_buckets must be >= 1, got {self.num_buckets}")

    @property
    def bucket_s(self) -> float:
        return self.recent_window_s / self.num_buckets

    @property
    def start_level(self) -> int:
        """Doublings above R the sample starts at: the most, with the rate at most 1."""
        return rate_level(self.sample_rate, 1.0, self.max_rate_doublings)


@dataclass
class AccessCounts:
    """Lookups over some span of time (a bucket, a window). A sampled lookup is counted
    under its rate's level: the doublings above R it was sampled at."""

    # level -> {distance in that level's sampled blocks: lookups}
    distances: dict[int, Counter] = field(default_factory=dict)
    cold: Counter = field(default_factory=Counter)  # level -> lookups of untracked blocks
    num_blocks: int = 0  # every full block looked up, sampled or not
    num_block_tokens: int = 0  # their tokens (num_blocks x block size)
    num_prompt_tokens: int = 0

    @property
    def num_sampled(self) -> int:
        return self.cold.total() + sum(c.total() for c in self.distances.values())

    def add(self, other: AccessCounts) -> None:
        for level, distances in other.distances.items():
            self.distances.setdefault(level, Counter()).update(distances)
        self.cold.update(other.cold)
        self.num_blocks += other.num_blocks
        self.num_block_tokens += other.num_block_tokens
        self.num_prompt_tokens += other.num_prompt_tokens

    def hit_ratio(self, capacity_blocks: float, sample_rate: float) -> float | None:
        """Estimated pooled LRU hit ratio in tokens at `capacity_blocks` (math.inf: any
        block seen before hits); None before any sampled lookup. `sample_rate`: R."""
        return self.hit_ratios([capacity_blocks], sample_rate)[0]

    def num_hits(self, capacity_blocks: float, sample_rate: float) -> int:
        """Sampled lookups a pooled LRU of `capacity_blocks` hits: distance / R_t < C."""
        return sum(n for level, distances in self.distances.items()
                   for d, n in distances.items()
                   if d < capacity_blocks * ladder_rate(sample_rate, level))

    def hit_ratios(self, capacities_blocks: Sequence[float], sample_rate: float
                   ) -> list[float | None]:
        """`hit_ratio` at each capacity, the distances read once (up to one entry per
        tracked block: the actor refreshes its series every second). A lookup sampled at
        R_t hits a pooled LRU of C blocks when its distance / R_t < C, and weighs 1 / R_t:
        2^(top - level) in whole numbers, so a sample of one rate is counted exactly."""
        num_sampled = self.num_sampled
        if num_sampled == 0 or self.num_prompt_tokens == 0:
            return [None] * len(capacities_blocks)
        top = max(chain(self.cold, self.distances))
        total = sum(n << (top - level) for level, n in self.cold.items())
        hits = np.zeros(len(capacities_blocks), np.int64)
        for level, by_distance in self.distances.items():
            size = len(by_distance)
            distances = np.fromiter(by_distance.keys(), np.int64, size)
            weighted = np.fromiter(by_distance.values(), np.int64, size) << (top - level)
            total += int(weighted.sum())
            rate = ladder_rate(sample_rate, level)
            hits += [weighted[distances < c * rate].sum() for c in capacities_blocks]
        return [int(h) / total * self.num_block_tokens / self.num_prompt_tokens for h in hits]


@dataclass
class _Bucket:
    start_s: float
    counts: AccessCounts = field(default_factory=AccessCounts)


class PooledHitCurve:
    """Replays sampled accesses; answers the pooled hit ratio per window and capacity."""

    def __init__(self, config: HitCurveConfig | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config or HitCurveConfig()
        self._clock = clock
        self.reuse = ReuseDistances(self.config.max_sampled_blocks)
        self.level = self.config.start_level  # the current rate's doublings above R
        self._threshold = sample_threshold(self.sample_rate)
        self._all = AccessCounts()
        self._buckets: list[_Bucket] = []  # oldest first, within the recent window
        self.num_sampled_accesses = 0  # lookups and touches replayed since start

    @property
    def sample_rate(self) -> float:
        """R_t: the rate the sample is kept at now (senders should sample at it)."""
        return ladder_rate(self.config.sample_rate, self.level)

    def set_capacity(self, capacity_blocks: int) -> None:
        """The fleet's device KV capacity: the rate halves while R_t x capacity exceeds
        `capacity_sampled_blocks`, down to R (it never rises again: the blocks dropped
        cannot be recovered)."""
        config, level = self.config, self.level
        while level > 0 and (ladder_rate(config.sample_rate, level) * capacity_blocks
                             > config.capacity_sampled_blocks):
            level -= 1
        self._lower(level)

    def _lower(self, level: int) -> None:
        if level < self.level:
            self.level = level
            self._threshold = sample_threshold(self.sample_rate)
            self.reuse.keep_below(self._threshold)

    def _thinned(self, sampled: Sequence[Sequence[BlockHash]], sample_rate: float
                 ) -> Sequence[Sequence[BlockHash]]:
        """`sampled` (hashes kept at `sample_rate`) at the current rate, which is lowered
        first when `sample_rate` is below it."""
        level = rate_level(self.config.sample_rate, sample_rate, self.config.max_rate_doublings)
        if level is None:
            raise ValueError(f"hashes sampled at {sample_rate} < R = {self.config.sample_rate}")
        self._lower(level)
        if sample_rate == self.sample_rate:
            return sampled
        return [sampled_hashes(hashes, self._threshold) for hashes in sampled]

    def add_prompts(self, sampled: Sequence[Sequence[BlockHash]], sample_rate: float,
                    num_blocks: int, num_prompt_tokens: int, block_size: int) -> None:
        """Routed prompts, in routing order: each one's hashes sampled at `sample_rate`
        (>= R), in prompt order, and the exact totals over all of them."""
        counts = AccessCounts(num_blocks=num_blocks, num_block_tokens=num_blocks * block_size,
                              num_prompt_tokens=num_prompt_tokens)
        sampled = self._thinned(sampled, sample_rate)
        distances, num_cold = Counter(), 0
        for hashes in sampled:
            for d in serve_prompt(self.reuse, hashes):
                if d is None:
                    num_cold += 1
                else:
                    distances[d] += 1
            self.num_sampled_accesses += 2 * len(hashes)
        if distances:
            counts.distances[self.level] = distances
        if num_cold:
            counts.cold[self.level] = num_cold
        self._all.add(counts)
        self._bucket().counts.add(counts)

    def add_released(self, sampled: Sequence[Sequence[BlockHash]], sample_rate: float) -> None:
        """Finished sequences' hashes sampled at `sample_rate`: cached again, as the pooled
        LRU does."""
        for hashes in self._thinned(sampled, sample_rate):
            release(self.reuse, hashes)
            self.num_sampled_accesses += len(hashes)

    def counts(self, window: str) -> AccessCounts:
        if window == "all":
            return self._all
        if window != "recent":
            raise ValueError(f"window must be one of {WINDOWS}, got {window!r}")
        self._expire()
        out = AccessCounts()
        for bucket in self._buckets:
            out.add(bucket.counts)
        return out

    def hit_ratio(self, capacity_blocks: float, window: str) -> float | None:
        return self.counts(window).hit_ratio(capacity_blocks, self.config.sample_rate)

    def _bucket(self) -> _Bucket:
        now = self._clock()
        bucket_s = self.config.bucket_s
        start_s = math.floor(now / bucket_s) * bucket_s
        if not self._buckets or self._buckets[-1].start_s != start_s:
            self._buckets.append(_Bucket(start_s))
            self._expire()
        return self._buckets[-1]

    def _expire(self) -> None:
        """Drops buckets that ended before the recent window began."""
        cutoff = self._clock() - self.config.recent_window_s - self.config.bucket_s
        while self._buckets and self._buckets[0].start_s <= cutoff:
            self._buckets.pop(0)
