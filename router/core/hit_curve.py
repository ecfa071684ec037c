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
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kv.hashing import BlockHash
from router.core.shards import ReuseDistances, release, serve_prompt

WINDOWS = ("recent", "all")


@dataclass(frozen=True)
class HitCurveConfig:
    sample_rate: float = 0.01  # R: the fraction of block hashes the routers sample
    # sampled blocks tracked; the least recent is forgotten beyond it, so "infinite"
    # capacity means max_sampled_blocks / R blocks (26M at R = 0.01)
    max_sampled_blocks: int = 1 << 18
    recent_window_s: float = 600.0  # the "recent" window (the last N minutes)
    num_buckets: int = 10  # the recent window moves in steps of recent_window_s / num_buckets

    def __post_init__(self):
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate}")
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


@dataclass
class AccessCounts:
    """Lookups over some span of time (a bucket, a window)."""

    distances: Counter = field(default_factory=Counter)  # sampled distance -> lookups
    num_cold: int = 0  # sampled lookups of blocks not tracked (never seen, or forgotten)
    num_blocks: int = 0  # every full block looked up, sampled or not
    num_block_tokens: int = 0  # their tokens (num_blocks x block size)
    num_prompt_tokens: int = 0

    @property
    def num_sampled(self) -> int:
        return self.num_cold + sum(self.distances.values())

    def add(self, other: AccessCounts) -> None:
        self.distances.update(other.distances)
        self.num_cold += other.num_cold
        self.num_blocks += other.num_blocks
        self.num_block_tokens += other.num_block_tokens
        self.num_prompt_tokens += other.num_prompt_tokens

    def hit_ratio(self, capacity_blocks: float, sample_rate: float) -> float | None:
        """Estimated pooled LRU hit ratio in tokens at `capacity_blocks` (math.inf: any
        block seen before hits); None before any sampled lookup."""
        return self.hit_ratios([capacity_blocks], sample_rate)[0]

    def num_hits(self, capacity_blocks: float, sample_rate: float) -> int:
        """Sampled lookups a pooled LRU of `capacity_blocks` hits: distance / R < C."""
        limit = capacity_blocks * sample_rate
        return sum(n for d, n in self.distances.items() if d < limit)

    def hit_ratios(self, capacities_blocks: Sequence[float], sample_rate: float
                   ) -> list[float | None]:
        """`hit_ratio` at each capacity, the distances read once (up to one entry per
        tracked block: the actor refreshes its series every second). A sampled lookup hits
        a pooled LRU of C blocks when its distance / R < C."""
        num_sampled = self.num_sampled
        if num_sampled == 0 or self.num_prompt_tokens == 0:
            return [None] * len(capacities_blocks)
        size = len(self.distances)
        distances = np.fromiter(self.distances.keys(), np.int64, size)
        counts = np.fromiter(self.distances.values(), np.int64, size)
        return [int(counts[distances < c * sample_rate].sum()) / num_sampled
                * self.num_block_tokens / self.num_prompt_tokens for c in capacities_blocks]


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
        self._all = AccessCounts()
        self._buckets: list[_Bucket] = []  # oldest first, within the recent window
        self.num_sampled_accesses = 0  # lookups and touches replayed since start

    def add_prompts(self, sampled: Sequence[Sequence[BlockHash]], num_blocks: int,
                    num_prompt_tokens: int, block_size: int) -> None:
        """Routed prompts, in routing order: each one's sampled hashes in prompt order,
        and the exact totals over all of them."""
        counts = AccessCounts(num_blocks=num_blocks, num_block_tokens=num_blocks * block_size,
                              num_prompt_tokens=num_prompt_tokens)
        distances = counts.distances
        for hashes in sampled:
            for d in serve_prompt(self.reuse, hashes):
                if d is None:
                    counts.num_cold += 1
                else:
                    distances[d] += 1
            self.num_sampled_accesses += 2 * len(hashes)
        self._all.add(counts)
        self._bucket().counts.add(counts)

    def add_released(self, sampled: Sequence[Sequence[BlockHash]]) -> None:
        """Finished sequences' sampled hashes: cached again, as the pooled LRU does."""
        for hashes in sampled:
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
