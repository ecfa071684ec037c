"""Per-request block tables over the block pool, with prefix matching, a host tier and pins.

Layout of one request's blocks (B = block_size), as the scheduler sees them:

    | device hits | host hits  | new blocks ...................... |
    |<- touched ->|<- copied ->|<- computed by this and later steps ->|
    0        num_device   num_cached                        ceil(num_tokens / B)

Device hits are shared (ref_cnt + 1); host hits get fresh device blocks filled by a copy
before the next forward; new blocks are computed and get their hash once full.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kv.block_pool import Block, BlockPool
from kv.events import EventLog
from kv.hashing import DEFAULT_BLOCK_SIZE, BlockHash
from kv.host_tier import HostTier


@dataclass(frozen=True)
class KVCacheConfig:
    num_blocks: int
    block_size: int = DEFAULT_BLOCK_SIZE
    num_host_blocks: int = 0
    enable_prefix_caching: bool = True
    pin_budget_blocks: int = 0

    def __post_init__(self):
        if self.num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {self.num_blocks}")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {self.num_host_blocks}")
        if not 0 <= self.pin_budget_blocks <= self.num_blocks:
            raise ValueError(f"pin_budget_blocks must be in [0, num_blocks], got "
                             f"{self.pin_budget_blocks}")


class MatchResult(NamedTuple):
    num_device_blocks: int  # leading blocks cached on the device
    num_host_blocks: int  # the blocks after those, found on the host tier
    num_pending_blocks: int  # the blocks after those, being computed by another request now

    @property
    def num_cached_blocks(self) -> int:
        return self.num_device_blocks + self.num_host_blocks


NO_MATCH = MatchResult(0, 0, 0)


class CopyPlan(NamedTuple):
    swap_out: list[tuple[int, int]]  # (device block_id, host slot): run first
    swap_in: list[tuple[int, int]]  # (host slot, device block_id): run second


@dataclass
class PrefixCacheStats:
    """Cumulative prefix-cache counters, in tokens."""

    query_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0

    def record(self, num_query_tokens: int, num_device_hit_tokens: int,
               num_host_hit_tokens: int) -> None:
        self.query_tokens += num_query_tokens
        self.device_hit_tokens += num_device_hit_tokens
        self.host_hit_tokens += num_host_hit_tokens


@dataclass
class _RequestBlocks:
    blocks: list[Block]
    num_hashed_blocks: int = 0  # leading blocks that carry their hash (or were duplicates)
    pending_hashes: list[BlockHash] = field(default_factory=list)  # ours in `_pending`
    # [b.block_id for b in blocks], handed to callers every step. Never changed in place:
    # growing the table builds a new list, so a list already handed out (a scheduled step's
    # block table) stays what it was. Rebuilt only when blocks are added (once per
    # block_size decoded tokens), not every step.
    block_ids: list[int] = field(init=False)

    def __post_init__(self):
        self.block_ids = [b.block_id for b in self.blocks]

    def extend(self, new_blocks: list[Block]) -> None:
        self.blocks.extend(new_blocks)
        self.block_ids = self.block_ids + [b.block_id for b in new_blocks]


class KVCacheManager:
    def __init__(self, config: KVCacheConfig, event_log: EventLog | None = None):
        self.config = config
        self.block_size = config.block_size
        self.event_log = event_log
        self.host = HostTier(config.num_host_blocks, event_log)
        self.pool = BlockPool(config.num_blocks, event_log,
                              on_evict=self._to_host if config.num_host_blocks else None)
        self.stats = PrefixCacheStats()
        self._requests: dict[str, _RequestBlocks] = {}
        self._pending: dict[BlockHash, str] = {}  # hash -> request computing it right now
        self._pins: dict[str, list[Block]] = {}
        self._pin_counts: dict[int, int] = {}  # block_id -> number of pins holding it
        self._swap_out: list[tuple[int, int]] = []
        self._swap_in: list[tuple[int, int]] = []
        self._locked_host: list[BlockHash] = []

    # -- lookups ---------------------------------------------------------------------------

    def match(self, block_hashes: Sequence[BlockHash]) -> MatchResult:
        """How many leading blocks are cached (device, then host), and how many after them
        another running request is computing now (wait for them rather than recompute)."""
        if not self.config.enable_prefix_caching:
            return NO_MATCH
        cached, host, pending = self.pool.cached, self.host, self._pending
        n = len(block_hashes)
        i = 0
        while i < n and block_hashes[i] in cached:
            i += 1
        num_device = i
        while i < n and block_hashes[i] in host:
            i += 1
        num_host = i - num_device
        j = i
        while j < n and block_hashes[j] in pending:
            j += 1
        return MatchResult(num_device, num_host, j - i)

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table. Shared and never changed afterwards: do not mutate."""
        return self._requests[request_id].block_ids

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    # -- allocation ------------------------------------------------------------------------

    def num_new_blocks_needed(self, request_id: str, num_tokens: int,
                              match: MatchResult = NO_MATCH) -> int:
        """Device blocks `allocate` would take from the free queue for `num_tokens` tokens."""
        num_total = -(-num_tokens // self.block_size)
        req = self._requests.get(request_id)
        if req is not None:
            return max(0, num_total - len(req.blocks))
        return max(0, num_total - match.num_device_blocks)

    def can_allocate(self, request_id: str, num_tokens: int, block_hashes: Sequence[BlockHash]
                     = (), match: MatchResult = NO_MATCH) -> bool:
        """True when `allocate` would succeed. Cached blocks this request reuses are not new
        allocations; evictable cached blocks count as free (unless this request revives
        them, which takes them out of the free queue)."""
        available = self.pool.num_free_blocks
        if request_id not in self._requests:
            for block_hash in block_hashes[: match.num_device_blocks]:
                if self.pool.cached[block_hash].ref_cnt == 0:
                    available -= 1
        return self.num_new_blocks_needed(request_id, num_tokens, match) <= available

    def allocate(self, request_id: str, num_tokens: int,
                 block_hashes: Sequence[BlockHash] = (),
                 match: MatchResult = NO_MATCH) -> list[int] | None:
        """Grows the request's block table to hold `num_tokens` tokens.

        On the first call the `match` (from `match(block_hashes)`, same step) reuses cached
        blocks. Returns the whole block table, or None (and no change) when short of blocks.
        The table is shared (see `block_ids`): callers must not mutate it.
        """
        req = self._requests.get(request_id)
        if req is not None:
            num_new = self.num_new_blocks_needed(request_id, num_tokens)
            if num_new:  # a decode step fills its last block: most steps add none
                new_blocks = self.pool.take_new_blocks(num_new)
                if new_blocks is None:
                    return None
                req.extend(new_blocks)
            return req.block_ids

        hits = [self.pool.cached[h] for h in block_hashes[: match.num_device_blocks]]
        host_hashes = list(block_hashes[len(hits) : len(hits) + match.num_host_blocks])
        self.pool.touch(hits)
        # Lock host hits first: the evictions below push blocks into the host tier, which
        # must not drop the very entries this request is about to copy back.
        host_slots = [self.host.lock(h) for h in host_hashes]
        new_blocks = self.pool.take_new_blocks(
            self.num_new_blocks_needed(request_id, num_tokens, match))
        if new_blocks is None:
            for h in host_hashes:
                self.host.unlock(h)
            self.pool.release(reversed(hits))
            return None
        req = self._requests[request_id] = _RequestBlocks(hits + new_blocks, len(hits))
        if host_hashes:
            copied = new_blocks[: len(host_hashes)]
            self._swap_in.extend(zip(host_slots, (b.block_id for b in copied)))
            self._locked_host.extend(host_hashes)
            self.pool.cache_blocks(copied, host_hashes, hits[-1].block_hash if hits else None)
            req.num_hashed_blocks += len(copied)
        self._mark_pending(request_id, req, block_hashes[req.num_hashed_blocks :])
        return req.block_ids

    def _mark_pending(self, request_id: str, req: _RequestBlocks,
                      block_hashes: Sequence[BlockHash]) -> None:
        """Records the prompt blocks this request will compute (in this step or in later
        chunks), so that others sharing them wait and hit instead of computing them again."""
        for block_hash in block_hashes:
            if block_hash not in self._pending:
                self._pending[block_hash] = request_id
                req.pending_hashes.append(block_hash)

    def cache_blocks(self, request_id: str, block_hashes: Sequence[BlockHash],
                     num_computed_tokens: int, token_ids: Sequence[int] | None = None) -> None:
        """Makes the request's full, computed blocks findable. `block_hashes` must cover
        every full block of the first `num_computed_tokens` tokens (prompt or generated);
        `token_ids`, when given, are the request's tokens (for events that carry them)."""
        if not self.config.enable_prefix_caching:
            return
        req = self._requests[request_id]
        num_full = min(num_computed_tokens // self.block_size, len(req.blocks))
        start = req.num_hashed_blocks
        if num_full <= start:
            return
        if len(block_hashes) < num_full:
            raise ValueError(f"{request_id}: {len(block_hashes)} hashes for {num_full} blocks")
        new_hashes = list(block_hashes[start:num_full])
        log = self.event_log
        block_tokens = (token_ids[start * self.block_size:num_full * self.block_size]
                        if token_ids is not None and log is not None and log.with_token_ids
                        else None)
        self.pool.cache_blocks(req.blocks[start:num_full], new_hashes,
                               block_hashes[start - 1] if start else None, block_tokens)
        for block_hash in new_hashes:
            if self._pending.get(block_hash) == request_id:
                del self._pending[block_hash]
        req.num_hashed_blocks = num_full

    def free(self, request_id: str) -> None:
        """Releases a finished or preempted request's blocks, tail first: the last blocks of
        a prompt are evicted before its shared head."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        for block_hash in req.pending_hashes:
            if self._pending.get(block_hash) == request_id:
                del self._pending[block_hash]
        self.pool.release(reversed(req.blocks))

    # -- host tier -------------------------------------------------------------------------

    def _to_host(self, block: Block) -> None:
        slot = self.host.put(block.block_hash)  # type: ignore[arg-type]
        if slot is not None:
            self._swap_out.append((block.block_id, slot))

    def take_copy_plan(self) -> CopyPlan:
        """The block copies to run before the next forward; hands them over once."""
        plan = CopyPlan(self._swap_out, self._swap_in)
        self._swap_out, self._swap_in = [], []
        for block_hash in self._locked_host:
            self.host.unlock(block_hash)
        self._locked_host = []
        return plan

    def abort_copy_plan(self, plan: CopyPlan) -> None:
        """The step that carried `plan` failed, maybe before its copies ran: forget every
        entry they were to fill, so no later request hits KV that was never written."""
        self.host.discard_slots({slot for _, slot in plan.swap_out})
        self.pool.uncache(self.pool.blocks[block_id] for _, block_id in plan.swap_in)

    # -- pinned prefixes -------------------------------------------------------------------

    def pin(self, name: str, block_hashes: Sequence[BlockHash]) -> int | None:
        """Pins cached device blocks so they are never evicted while pinned.

        Returns the number of blocks pinned, or None when a block is not cached on the
        device or the pin budget would be exceeded. Pinning a name again replaces it.
        """
        blocks = [self.pool.cached.get(h) for h in block_hashes]
        if any(b is None for b in blocks):
            return None
        new_ids = {b.block_id for b in blocks}  # type: ignore[union-attr]
        # A re-pin frees the old pin's blocks that no other pin holds: credit them.
        freed = {b.block_id for b in self._pins.get(name, [])
                 if self._pin_counts[b.block_id] == 1} - new_ids
        num_new = len(new_ids - self._pin_counts.keys())
        if len(self._pin_counts) - len(freed) + num_new > self.config.pin_budget_blocks:
            return None
        self.unpin(name)
        self.pool.touch(blocks)  # type: ignore[arg-type]
        for b in blocks:
            self._pin_counts[b.block_id] = self._pin_counts.get(b.block_id, 0) + 1
        self._pins[name] = blocks  # type: ignore[assignment]
        return len(blocks)

    def unpin(self, name: str) -> bool:
        blocks = self._pins.pop(name, None)
        if blocks is None:
            return False
        for b in blocks:
            n = self._pin_counts[b.block_id] - 1
            if n:
                self._pin_counts[b.block_id] = n
            else:
                del self._pin_counts[b.block_id]
        self.pool.release(reversed(blocks))
        return True

    @property
    def num_pinned_blocks(self) -> int:
        return len(self._pin_counts)

    def num_blocks_beside_pins(self, num_tokens: int, block_hashes: Sequence[BlockHash]
                               ) -> tuple[int, int]:
        """(unpinned blocks a `num_tokens` request needs, unpinned blocks the pool has): a
        request whose need exceeds the second can never run here while the pins stay. Its
        leading blocks that are pinned already are not needed again."""
        num_needed = -(-num_tokens // self.block_size)
        for block_hash in block_hashes:
            block = self.pool.cached.get(block_hash)
            if block is None or block.block_id not in self._pin_counts:
                break
            num_needed -= 1
        return num_needed, self.pool.num_blocks - len(self._pin_counts)

    # -- introspection ---------------------------------------------------------------------

    def usage(self) -> dict[str, int]:
        """Blocks by state: used (referenced by requests), cached (free but findable),
        pinned, free (no reference, no hash). The four sum to num_blocks."""
        pool = self.pool
        num_pinned = len(self._pin_counts)
        num_cached_free = pool.num_cached_free_blocks
        return {
            "used": pool.num_blocks - pool.num_free_blocks - num_pinned,
            "cached": num_cached_free,
            "pinned": num_pinned,
            "free": pool.num_free_blocks - num_cached_free,
        }

    def snapshot(self):
        """A Protocol 2 snapshot of what this replica holds, valid at the log's position."""
        assert self.event_log is not None, "snapshot needs an event log"
        return self.event_log.snapshot(self.pool.cached_hashes(), self.host.hashes())

    def check_invariants(self) -> None:
        self.pool.check_invariants()
        self.host.check_invariants()
        refs: dict[int, int] = {}
        for req in self._requests.values():
            assert 0 <= req.num_hashed_blocks <= len(req.blocks)
            ids = [b.block_id for b in req.blocks]
            assert req.block_ids == ids, "cached block table differs from the blocks"
            assert len(set(ids)) == len(ids), "a request holds a block twice"
            for b in req.blocks:
                refs[b.block_id] = refs.get(b.block_id, 0) + 1
        for blocks in self._pins.values():
            for b in blocks:
                assert b.block_hash is not None, f"pinned {b} lost its hash"
                refs[b.block_id] = refs.get(b.block_id, 0) + 1
        for block in self.pool.blocks:
            assert block.ref_cnt == refs.get(block.block_id, 0), (
                f"{block}: ref_cnt != {refs.get(block.block_id, 0)} holders")
        assert len(self._pin_counts) <= self.config.pin_budget_blocks, "pin budget exceeded"
        for owner in self._pending.values():
            assert owner in self._requests, f"pending block of gone request {owner}"
