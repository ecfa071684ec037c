"""Bounds on what one worker's KV event stream may cost the index actor's event loop.

The loop that applies a worker's events also answers every router's poll; a router that
hears nothing for 5 s routes that worker's requests on its own history. So a large batch
is decoded and mapped in a thread (`off_loop`), reaches the index in pieces (`pieces`),
and each worker spends blocks from its own `BlockBudget`: a worker that floods is cut off,
the others are not slowed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from kv.events import BlockRemoved, BlockStored, KVEvent

T = TypeVar("T")


class BlockBudget:
    """A token bucket of blocks: `rate_per_s` come back every second, up to `capacity`."""

    def __init__(self, rate_per_s: float, capacity: int,
                 clock: Callable[[], float] = time.monotonic):
        self._rate_per_s = rate_per_s
        self._capacity = capacity
        self._clock = clock
        self._num_blocks = float(capacity)
        self._at_s = clock()

    def take(self, num_blocks: int) -> bool:
        """Spends `num_blocks` if the bucket holds them; False (nothing spent) if not."""
        now = self._clock()
        self._num_blocks = min(self._capacity,
                               self._num_blocks + (now - self._at_s) * self._rate_per_s)
        self._at_s = now
        if num_blocks > self._num_blocks:
            return False
        self._num_blocks -= num_blocks
        return True


async def off_loop(num_bytes: int, inline_bytes: int, fn: Callable[..., T], *args) -> T:
    """fn(*args), in a thread when `num_bytes` is over `inline_bytes` (a thread hop costs
    ~0.1 ms: worth it only for work the loop must not wait on). Pure-Python work in a
    thread gives the loop the GIL every switch interval (5 ms)."""
    if num_bytes <= inline_bytes:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def pieces(events: list[KVEvent], max_blocks: int) -> list[list[KVEvent]]:
    """`events`, in order, cut into lists of at most `max_blocks` blocks each; an event
    with more blocks is split (a store's piece chains on the previous piece's last block)."""
    out: list[list[KVEvent]] = [[]]
    num_blocks = 0
    for event in events:
        if isinstance(event, (BlockStored, BlockRemoved)):
            hashes = event.block_hashes
            start = 0
            while start < len(hashes):
                if num_blocks == max_blocks:
                    out.append([])
                    num_blocks = 0
                end = min(len(hashes), start + max_blocks - num_blocks)
                out[-1].append(_slice(event, start, end))
                num_blocks += end - start
                start = end
        else:
            out[-1].append(event)
    return [p for p in out if p]


def _slice(event: BlockStored | BlockRemoved, start: int, end: int) -> KVEvent:
    if start == 0 and end == len(event.block_hashes):
        return event
    hashes = event.block_hashes[start:end]
    if isinstance(event, BlockRemoved):
        return BlockRemoved(hashes, event.medium)
    size = len(event.token_ids) // len(event.block_hashes) if event.token_ids else 0
    parent = event.parent_hash if start == 0 else event.block_hashes[start - 1]
    return BlockStored(hashes, parent, event.medium, event.token_ids[start * size:end * size])
