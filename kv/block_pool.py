"""The device block pool: preallocated blocks, a hash table, and an LRU free queue.

Blocks are never created after start-up. A block with `ref_cnt == 0` sits in the free
queue; if it still has a `block_hash` it stays findable in the hash table and a later hit
revives it. Allocation takes blocks from the queue's head (least recently freed) and only
then drops their hashes (eviction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from operator import attrgetter, is_not

from kv.events import BlockRemoved, BlockStored, EventLog
from kv.hashing import BlockHash


class Block:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return f"Block({self.block_id}, ref_cnt={self.ref_cnt}, hash={h})"


class FreeBlockQueue:
    """Doubly linked LRU list of free blocks: O(1) append and removal from the middle; a run
    of k blocks pops off the head in O(k) with one splice.

    The links are two int lists indexed by block_id (`_next`, `_prev`; the two slots after
    the last block are the head and tail sentinels), not pointers inside the blocks. Walking
    a run reads those compact lists, and a popped run is unlinked by re-pointing only the
    head, not by four link writes per block. Links of blocks not in the queue are stale and
    never read.

    Args:
        blocks: every block of the pool, `blocks[i].block_id == i`; all start free, in order.
    """

    def __init__(self, blocks: Sequence[Block]):
        for i, block in enumerate(blocks):
            if block.block_id != i:
                raise ValueError(f"blocks[{i}] has block_id {block.block_id}")
        num_blocks = len(blocks)
        self._blocks = blocks
        self._head, self._tail = num_blocks, num_blocks + 1
        self._next = [self._tail] * (num_blocks + 2)
        self._prev = [self._head] * (num_blocks + 2)
        self.num_free_blocks = 0
        self.extend(blocks)

    def append(self, block: Block) -> None:
        i, tail, prv = block.block_id, self._tail, self._prev
        last = prv[tail]
        self._next[last] = i
        prv[i] = last
        self._next[i] = tail
        prv[tail] = i
        self.num_free_blocks += 1

    def extend(self, blocks: Sequence[Block]) -> None:
        """Appends blocks at the tail in the given order."""
        if not blocks:
            return
        nxt, prv, tail = self._next, self._prev, self._tail
        last = prv[tail]
        for block in blocks:
            i = block.block_id
            nxt[last] = i
            prv[i] = last
            last = i
        nxt[last] = tail
        prv[tail] = last
        self.num_free_blocks += len(blocks)

    def remove(self, block: Block) -> None:
        i, nxt, prv = block.block_id, self._next, self._prev
        before, after = prv[i], nxt[i]
        nxt[before] = after
        prv[after] = before
        self.num_free_blocks -= 1

    def popleft_blocks(self, num_blocks: int) -> list[Block]:
        """Unlinks and returns the `num_blocks` least recently freed blocks, oldest first."""
        if not 0 <= num_blocks <= self.num_free_blocks:
            raise ValueError(f"cannot pop {num_blocks} of {self.num_free_blocks} free blocks")
        nxt, head = self._next, self._head
        ids = []
        append = ids.append
        i = nxt[head]
        for _ in range(num_blocks):
            append(i)
            i = nxt[i]
        nxt[head] = i
        self._prev[i] = head
        self.num_free_blocks -= num_blocks
        return list(map(self._blocks.__getitem__, ids))

    def __iter__(self) -> Iterator[Block]:
        i, nxt, tail, blocks = self._next[self._head], self._next, self._tail, self._blocks
        while i != tail:
            yield blocks[i]
            i = nxt[i]

    def block_ids(self) -> list[int]:
        return [b.block_id for b in self]

    def check_invariants(self) -> None:
        forward = self.block_ids()
        assert len(forward) == self.num_free_blocks, "free count drifted"
        backward, i, prv = [], self._prev[self._tail], self._prev
        while i != self._head and len(backward) <= len(forward):
            backward.append(i)
            i = prv[i]
        assert backward[::-1] == forward, "prev links disagree with next links"


EvictHook = Callable[[Block], None]
_get_block_hash = attrgetter("block_hash")
_is_not_none = partial(is_not, None)


class BlockPool:
    """All device blocks of one replica.

    Args:
        num_blocks: pool size.
        event_log: receives BlockStored / BlockRemoved (medium "device") when given.
        on_evict: called with each cached block taken for reuse, in LRU order, before its
            hash is dropped (the host tier uses it to keep a copy).
    """

    def __init__(self, num_blocks: int, event_log: EventLog | None = None,
                 on_evict: EvictHook | None = None):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[BlockHash, Block] = {}
        self.event_log = event_log
        self.on_evict = on_evict
        self.num_evictions = 0
        self.num_cached_free_blocks = 0  # ref_cnt 0 and still findable by hash

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_cnt 0, cached or not: all of them can be allocated."""
        return self.free_queue.num_free_blocks

    def lookup(self, block_hash: BlockHash) -> Block | None:
        return self.cached.get(block_hash)

    def take_new_blocks(self, num_blocks: int) -> list[Block] | None:
        """Pops `num_blocks` blocks from the LRU head, evicting their hashes; None if short."""
        if num_blocks > self.free_queue.num_free_blocks:
            return None
        out = self.free_queue.popleft_blocks(num_blocks)
        # Passes rather than one Python loop: in a large pool the evicted blocks and their
        # hash objects are cold, and this C-level pass (map, filter) keeps many of those
        # cache misses in flight at once; the dict deletes below then find them loaded.
        evicted = list(filter(_is_not_none, map(_get_block_hash, out)))
        if evicted:
            if self.on_evict is not None:
                for block in out:
                    if block.block_hash is not None:
                        self.on_evict(block)
            cached = self.cached
            for block_hash in evicted:
                del cached[block_hash]
            self.num_cached_free_blocks -= len(evicted)
            self.num_evictions += len(evicted)
            if self.event_log is not None:
                self.event_log.append(BlockRemoved(tuple(evicted), "device"))
        for block in out:
            block.block_hash = None
            block.ref_cnt = 1
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Takes a reference on cache-hit blocks, reviving freed ones."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
                if block.block_hash is not None:
                    self.num_cached_free_blocks -= 1
            block.ref_cnt += 1

    def release(self, blocks: Iterable[Block]) -> None:
        """Drops a reference; blocks reaching 0 join the free queue tail in the given order."""
        freed = []
        num_cached = 0
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                freed.append(block)
                if block.block_hash is not None:
                    num_cached += 1
        self.free_queue.extend(freed)
        self.num_cached_free_blocks += num_cached

    def cache_blocks(self, blocks: list[Block], hashes: list[BlockHash],
                     parent_hash: BlockHash | None,
                     token_ids: Sequence[int] | None = None) -> int:
        """Gives full, computed blocks their hashes. Returns how many became findable.

        A block whose hash is already held by another block (two requests computed the same
        prefix) stays uncached: the table keeps one block per hash. `token_ids` (the blocks'
        tokens, an equal number per block) go into the events when the log records them.
        """
        num_stored = 0
        run: list[BlockHash] = []  # consecutive newly stored hashes, for one event
        run_parent = parent_hash
        run_start = 0  # index of run[0] in blocks
        for i, (block, block_hash) in enumerate(zip(blocks, hashes)):
            assert block.block_hash is None, f"{block} is already cached"
            assert block.ref_cnt > 0, f"{block} is free: only held blocks get hashes"
            if block_hash in self.cached:
                self._emit_stored(run, run_parent, run_start, len(blocks), token_ids)
                run, run_parent, run_start = [], block_hash, i + 1
                continue
            block.block_hash = block_hash
            self.cached[block_hash] = block
            run.append(block_hash)
            num_stored += 1
        self._emit_stored(run, run_parent, run_start, len(blocks), token_ids)
        return num_stored

    def uncache(self, blocks: Iterable[Block]) -> None:
        """Makes blocks unfindable (their data was never written); they stay allocated or
        free as they were."""
        dropped = []
        for block in blocks:
            if block.block_hash is None or self.cached.get(block.block_hash) is not block:
                continue
            del self.cached[block.block_hash]
            dropped.append(block.block_hash)
            block.block_hash = None
            if block.ref_cnt == 0:
                self.num_cached_free_blocks -= 1
        if dropped and self.event_log is not None:
            self.event_log.append(BlockRemoved(tuple(dropped), "device"))

    def _emit_stored(self, run: list[BlockHash], parent_hash: BlockHash | None,
                     run_start: int, num_blocks: int,
                     token_ids: Sequence[int] | None) -> None:
        if not run or self.event_log is None:
            return
        run_tokens: tuple[int, ...] = ()
        if token_ids is not None and self.event_log.with_token_ids:
            block_size = len(token_ids) // num_blocks
            run_tokens = tuple(token_ids[run_start * block_size:
                                         (run_start + len(run)) * block_size])
        self.event_log.append(BlockStored(tuple(run), parent_hash, "device", run_tokens))

    def cached_hashes(self) -> list[BlockHash]:
        return list(self.cached)

    def check_invariants(self) -> None:
        self.free_queue.check_invariants()
        free_ids = self.free_queue.block_ids()
        assert len(set(free_ids)) == len(free_ids), "a block is twice in the free queue"
        free_set = set(free_ids)
        num_cached_free = sum(1 for b in self.free_queue if b.block_hash is not None)
        assert num_cached_free == self.num_cached_free_blocks, "cached-free count drifted"
        for block in self.blocks:
            assert block.ref_cnt >= 0, f"{block} has a negative ref_cnt"
            assert (block.ref_cnt == 0) == (block.block_id in free_set), (
                f"{block}: in free queue must equal ref_cnt == 0")
            if block.block_hash is not None:
                assert self.cached.get(block.block_hash) is block, f"{block} not in hash table"
        for block_hash, block in self.cached.items():
            assert block.block_hash == block_hash, f"table maps {block_hash.hex()} to {block}"
