"""A router's side of the online pooled bound: sample each routed prompt, send in batches.

On the decision path a prompt costs a list append and two additions: its hash list is
kept by reference. The router's link takes everything as one `AccessBatch` twice a second,
off the decision path, and sends it to the hit-bound actor (router/cluster/hit_bound.py):
`take` applies the SHARDS threshold (router/core/shards.py) then, ~8 us of CPU for a
450-block prompt, which on the decision path would have been most of a decision's cost.

An engine replica samples its finished sequences the same way (`on_released`): the pooled
LRU caches a sequence's generated blocks when it ends, and a router never sees those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

from kv.hashing import BlockHash
from router.core.shards import sample_threshold, sampled_hashes

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
    # routed prompts (and finished sequences) held between two batches; beyond it (the
    # actor unreachable) every prompt is dropped whole and counted, so the totals and the
    # sample stay alike, and finished sequences are dropped
    max_pending_prompts: int = 65536

    def __post_init__(self):
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate}")
        if self.max_pending_prompts < 1:
            raise ValueError(f"max_pending_prompts must be >= 1, got "
                             f"{self.max_pending_prompts}")


def sample_lists(hash_lists: Sequence[Sequence[BlockHash]], threshold: bytes
                 ) -> tuple[bytes, tuple[int, ...]]:
    """The hashes below `threshold` of each list, concatenated, and how many each list
    kept (lists that kept none left out)."""
    kept = [sampled_hashes(hashes, threshold) for hashes in hash_lists]
    return b"".join(chain.from_iterable(kept)), tuple(len(k) for k in kept if k)


class AccessSampler:
    """Holds routed prompts and finished sequences; `take` samples them into one batch."""

    def __init__(self, source_id: str, block_size: int, config: SamplerConfig | None = None):
        self.source_id = source_id
        self.block_size = block_size
        self.config = config or SamplerConfig()
        self._threshold = sample_threshold(self.config.sample_rate)
        self._reset()

    def set_sample_rate(self, sample_rate: float) -> None:
        """Samples at `sample_rate` from the next `take` on (held hashes included)."""
        self.config = SamplerConfig(sample_rate, self.config.max_pending_prompts)
        self._threshold = sample_threshold(sample_rate)

    def _reset(self) -> None:
        self._routed: list[Sequence[BlockHash]] = []
        self._released: list[Sequence[BlockHash]] = []
        self._num_blocks = 0
        self._num_prompt_tokens = 0
        self._num_dropped = 0

    @property
    def is_empty(self) -> bool:
        return not (self._routed or self._released or self._num_dropped)

    def on_routed(self, block_hashes: Sequence[BlockHash], num_prompt_tokens: int) -> None:
        """Counts a routed prompt (its full blocks' hashes, in prompt order; kept by
        reference, so never changed afterwards)."""
        if len(self._routed) >= self.config.max_pending_prompts:
            self._num_dropped += 1
            return
        self._routed.append(block_hashes)
        self._num_blocks += len(block_hashes)
        self._num_prompt_tokens += num_prompt_tokens

    def on_released(self, block_hashes: Sequence[BlockHash]) -> None:
        """A finished sequence's hashes (prompt and generated blocks)."""
        if len(self._released) < self.config.max_pending_prompts:
            self._released.append(block_hashes)

    def take(self, capacity_blocks: int | None) -> AccessBatch | None:
        """Everything held since the last take, sampled; None when there is nothing."""
        if self.is_empty:
            return None
        prompt_hashes, prompt_sizes = sample_lists(self._routed, self._threshold)
        released_hashes, released_sizes = sample_lists(self._released, self._threshold)
        batch = AccessBatch(self.source_id, self.block_size, self.config.sample_rate,
                            capacity_blocks, prompt_hashes, prompt_sizes, self._num_blocks,
                            self._num_prompt_tokens, self._num_dropped, released_hashes,
                            released_sizes)
        self._reset()
        return batch
