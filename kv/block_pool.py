"""The device block pool: preallocated blocks, a hash table, and an LRU free queue.

Blocks are never created after start-up. A block with `ref_cnt == 0` sits in the free
queue; if it still has a `block_hash` it stays findable in the hash table and a later hit
revives it. Allocation takes blocks from the queue's head (least recently freed) and only
then drops their hashes (eviction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kv.events import BlockRemoved, BlockStored, EventLog
from kv.hashing import BlockHash


class Block:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.prev_free: Block | None = None
        self.next_free: Block | None = None

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return f"Block({self.block_id}, ref_cnt={self.ref_cnt}, hash={h})"


class FreeBlockQueue:
    """Doubly linked LRU list threaded through the blocks: O(1) append, pop, remove."""

    def __init__(self, blocks: Iterable[Block]):
        self._head = Block(-1)  # sentinels keep the link code branch-free
        self._tail = Block(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def append(self, block: Block) -> None:
        last = self._tail.prev_free
        block.prev_free, block.next_free = last, self._tail
        last.next_free = self._tail.prev_free = block  # type: ignore[union-attr]
        self.num_free_blocks += 1

    def remove(self, block: Block) -> None:
        block.prev_free.next_free = block.next_free  # type: ignore[union-attr]
        block.next_free.prev_free = block.prev_free  # type: ignore[union-attr]
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def popleft(self) -> Block | None:
        first = self._head.next_free
        if first is self._tail:
            return None
        self.remove(first)  # type: ignore[arg-type]
        return first

    def __iter__(self):
        node = self._head.next_free
        while node is not self._tail:
            yield node
            node = node.next_free  # type: ignore[union-attr]

    def block_ids(self) -> list[int]:
        return [b.block_id for b in self]


EvictHook = Callable[[Block], None]


class BlockPool:
    """All device blocks of one replica.

    Args:
        num_blocks: pool size.
        event_log: receives BlockStored / BlockRemoved (medium "device") when given.
        on_evict: called with a cached block just before its hash is dropped for reuse (the
            host tier uses it to keep a copy).
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
        out = []
        evicted: list[BlockHash] = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            assert block is not None
            if block.block_hash is not None:
                self.num_cached_free_blocks -= 1
                if self.on_evict is not None:
                    self.on_evict(block)
                del self.cached[block.block_hash]
                evicted.append(block.block_hash)
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        if evicted:
            self.num_evictions += len(evicted)
            if self.event_log is not None:
                self.event_log.append(BlockRemoved(tuple(evicted), "device"))
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
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)
                if block.block_hash is not None:
                    self.num_cached_free_blocks += 1

    def cache_blocks(self, blocks: list[Block], hashes: list[BlockHash],
                     parent_hash: BlockHash | None) -> int:
        """Gives full, computed blocks their hashes. Returns how many became findable.

        A block whose hash is already held by another block (two requests computed the same
        prefix) stays uncached: the table keeps one block per hash.
        """
        num_stored = 0
        run: list[BlockHash] = []  # consecutive newly stored hashes, for one event
        run_parent = parent_hash
        for block, block_hash in zip(blocks, hashes):
            assert block.block_hash is None, f"{block} is already cached"
            assert block.ref_cnt > 0, f"{block} is free: only held blocks get hashes"
            if block_hash in self.cached:
                self._emit_stored(run, run_parent)
                run, run_parent = [], block_hash
                continue
            block.block_hash = block_hash
            self.cached[block_hash] = block
            run.append(block_hash)
            num_stored += 1
        self._emit_stored(run, run_parent)
        return num_stored

    def _emit_stored(self, run: list[BlockHash], parent_hash: BlockHash | None) -> None:
        if run and self.event_log is not None:
            self.event_log.append(BlockStored(tuple(run), parent_hash, "device"))

    def cached_hashes(self) -> list[BlockHash]:
        return list(self.cached)

    def check_invariants(self) -> None:
        free_ids = self.free_queue.block_ids()
        assert len(free_ids) == self.free_queue.num_free_blocks, "free count drifted"
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
