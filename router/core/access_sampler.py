"""A router's side of the online pooled bound: sample each routed prompt, send in batches.

On the decision path a prompt costs one C-level filter of its block hashes against the
SHARDS threshold (router/core/shards.py) and a few additions; the kept hashes wait here
until the router's link takes them as one `AccessBatch` (a few times a second, off the
decision path) and sends it to the hit-bound actor (router/cluster/hit_bound.py).

An engine replica samples its finished sequences the same way (`on_released`): the pooled
LRU caches a sequence's generated blocks when it ends, and a router never sees those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kv.hashing import BlockHash
from router.core.shards import sample_threshold

HASH_BYTES = 16


@dataclass(frozen=True)
class AccessBatch:
    """One router's sampled accesses since its last batch, in routing order.

    Hashes travel concatenated (16 bytes each: one bytes object pickles in microseconds,
    a list of thousands does not); `prompt_sizes[i]` is how many of `prompt_hashes` belong
    to the i-th routed prompt that had any sampled block, in prompt order; the same for
    `released_hashes` and finished sequences.
    """

    source_id: str
    block_size: int  # tokens a block
    sample_rate: float  # R the hashes were sampled at
    capacity_blocks: int | None  # the fleet's device KV blocks as this router sees them
    prompt_hashes: bytes
    prompt_sizes: tuple[int, ...]
    num_blocks: int  # every full block of every routed prompt, sampled or not
    num_prompt_tokens: int
    num_dropped_prompts: int = 0  # routed while the batch was full: not in the totals
    released_hashes: bytes = b""
    released_sizes: tuple[int, ...] = ()

    def prompts(self) -> list[list[BlockHash]]:
        """The sampled hashes of each prompt."""
        return _split(self.prompt_hashes, self.prompt_sizes)

    def released(self) -> list[list[BlockHash]]:
        """The sampled hashes of each finished sequence."""
        return _split(self.released_hashes, self.released_sizes)

    @property
    def num_sampled(self) -> int:
        return len(self.prompt_hashes) // HASH_BYTES


def _split(data: bytes, sizes: Sequence[int]) -> list[list[BlockHash]]:
    out, start = [], 0
    for size in sizes:
        end = start + size * HASH_BYTES
        out.append([data[i:i + HASH_BYTES] for i in range(start, end, HASH_BYTES)])
        start = end
    return out


@dataclass(frozen=True)
class SamplerConfig:
    sample_rate: float = 0.01  # R: a block hash is kept when it is below R x 2^64
    # prompts with a sampled block kept between two batches; beyond it (the actor
    # unreachable) every prompt is dropped whole and counted, sampled or not, so the totals
    # and the sample stay alike; finished sequences beyond it are dropped
    max_pending_prompts: int = 65536

    def __post_init__(self):
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate}")
        if self.max_pending_prompts < 1:
            raise ValueError(f"max_pending_prompts must be >= 1, got "
                             f"{self.max_pending_prompts}")


class AccessSampler:
    """Samples routed prompts; `take` empties what was kept into one batch."""

    def __init__(self, source_id: str, block_size: int, config: SamplerConfig | None = None):
        self.source_id = source_id
        self.block_size = block_size
        self.config = config or SamplerConfig()
        self._threshold = sample_threshold(self.config.sample_rate)
        self._reset()

    def _reset(self) -> None:
        self._hashes: list[BlockHash] = []
        self._sizes: list[int] = []
        self._num_blocks = 0
        self._num_prompt_tokens = 0
        self._num_dropped = 0
        self._released: list[BlockHash] = []
        self._released_sizes: list[int] = []

    def on_routed(self, block_hashes: Sequence[BlockHash], num_prompt_tokens: int) -> None:
        """Counts a routed prompt and keeps its sampled hashes (its full blocks' hashes,
        in prompt order)."""
        if len(self._sizes) >= self.config.max_pending_prompts:
            self._num_dropped += 1
            return
        sampled = list(filter(self._threshold.__gt__, block_hashes))
        if sampled:
            self._hashes += sampled
            self._sizes.append(len(sampled))
        self._num_blocks += len(block_hashes)
        self._num_prompt_tokens += num_prompt_tokens

    def on_released(self, block_hashes: Sequence[BlockHash]) -> None:
        """Keeps a finished sequence's sampled hashes (prompt and generated blocks)."""
        if len(self._released_sizes) >= self.config.max_pending_prompts:
            return
        sampled = list(filter(self._threshold.__gt__, block_hashes))
        if sampled:
            self._released += sampled
            self._released_sizes.append(len(sampled))

    def take(self, capacity_blocks: int | None) -> AccessBatch | None:
        """Everything kept since the last take, or None when there is nothing."""
        if self._num_prompt_tokens == 0 and not self._num_dropped and not self._released:
            return None
        batch = AccessBatch(self.source_id, self.block_size, self.config.sample_rate,
                            capacity_blocks, b"".join(self._hashes), tuple(self._sizes),
                            self._num_blocks, self._num_prompt_tokens, self._num_dropped,
                            b"".join(self._released), tuple(self._released_sizes))
        self._reset()
        return batch
