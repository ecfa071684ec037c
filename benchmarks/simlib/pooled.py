"""The reference bound: one LRU cache with the cluster's total capacity, same request order.

It sees what one big engine would: a prompt's blocks are looked up and cached when the
request is routed, and the whole sequence (prompt + generated blocks) is released tail first
when it finishes, so a prompt's shared head stays most recent. Hits follow the engine's
rule: a fully cached prompt still computes its last token. Nothing is pinned by running
requests and nothing waits for a prefill, so it is optimistic; it is a reference, not a
proof of optimality (LRU is not Belady).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kv.hashing import BlockHash


class PooledLRU:
    def __init__(self, capacity_blocks: int, block_size: int):
        if capacity_blocks <= 0 or block_size <= 0:
            raise ValueError(f"capacity_blocks and block_size must be positive, got "
                             f"{capacity_blocks}, {block_size}")
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self._lru: OrderedDict[BlockHash, None] = OrderedDict()  # least recent first
        self.query_tokens = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._lru

    def serve_prompt(self, block_hashes: Sequence[BlockHash], num_prompt_tokens: int) -> int:
        """Looks the prompt up, then caches its blocks. Returns its hit tokens."""
        lru = self._lru
        n = 0
        for h in block_hashes:
            if h not in lru:
                break
            n += 1
        hit_tokens = min(n * self.block_size, num_prompt_tokens - 1)
        self.query_tokens += num_prompt_tokens
        self.hit_tokens += hit_tokens
        self.release(block_hashes)
        return hit_tokens

    def release(self, block_hashes: Sequence[BlockHash]) -> None:
        """Caches the blocks, tail first (the head ends most recent), evicting the LRU."""
        lru = self._lru
        move = lru.move_to_end
        for h in reversed(block_hashes):
            if h in lru:
                move(h)
            else:
                lru[h] = None
        while len(lru) > self.capacity_blocks:
            lru.popitem(last=False)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0
