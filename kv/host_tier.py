"""Host-memory tier bookkeeping: a second, larger LRU of blocks keyed by block hash.

Blocks evicted from the device pool may be copied here; a later prompt that misses on the
device but hits here is copied back instead of recomputed. This class only does the
accounting (which host slot holds which hash); the engine moves the bytes.
"""

from __future__ import annotations

from collections import OrderedDict

from kv.events import BlockRemoved, BlockStored, EventLog
from kv.hashing import BlockHash


class HostTier:
    def __init__(self, num_blocks: int, event_log: EventLog | None = None):
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.event_log = event_log
        self._slots: OrderedDict[BlockHash, int] = OrderedDict()  # LRU first
        self._free_slots = list(range(num_blocks - 1, -1, -1))
        self._locked: dict[BlockHash, int] = {}  # hash -> pending reads; not evictable
        self.num_evictions = 0

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def slot_of(self, block_hash: BlockHash) -> int | None:
        return self._slots.get(block_hash)

    def put(self, block_hash: BlockHash, parent_hash: BlockHash | None = None) -> int | None:
        """A host slot to copy `block_hash` into, evicting the LRU entry if full.

        Returns None when the tier is empty-sized, already holds the hash (no copy needed),
        or every slot is locked by a pending read.
        """
        if self.num_blocks == 0 or block_hash in self._slots:
            return None
        if not self._free_slots and not self._evict_one():
            return None
        slot = self._free_slots.pop()
        self._slots[block_hash] = slot
        if self.event_log is not None:
            self.event_log.append(BlockStored((block_hash,), parent_hash, "host"))
        return slot

    def lock(self, block_hash: BlockHash) -> int:
        """Marks a pending copy-back from this hash's slot; returns the slot."""
        slot = self._slots[block_hash]
        self._slots.move_to_end(block_hash)
        self._locked[block_hash] = self._locked.get(block_hash, 0) + 1
        return slot

    def unlock(self, block_hash: BlockHash) -> None:
        n = self._locked[block_hash] - 1
        if n:
            self._locked[block_hash] = n
        else:
            del self._locked[block_hash]

    def discard_slots(self, slots: set[int]) -> None:
        """Drops the entries held in `slots` (copies that never ran: their data is garbage)."""
        for block_hash in [h for h, slot in self._slots.items() if slot in slots]:
            if block_hash in self._locked:
                continue  # read by a later, still pending plan: its lock owner decides
            self._free_slots.append(self._slots.pop(block_hash))
            if self.event_log is not None:
                self.event_log.append(BlockRemoved((block_hash,), "host"))

    def _evict_one(self) -> bool:
        for block_hash in self._slots:
            if block_hash not in self._locked:
                self._free_slots.append(self._slots.pop(block_hash))
                self.num_evictions += 1
                if self.event_log is not None:
                    self.event_log.append(BlockRemoved((block_hash,), "host"))
                return True
        return False

    def hashes(self) -> list[BlockHash]:
        return list(self._slots)

    def check_invariants(self) -> None:
        used = list(self._slots.values())
        assert len(set(used)) == len(used), "two hashes share a host slot"
        assert not set(used) & set(self._free_slots), "a slot is both used and free"
        assert len(used) + len(self._free_slots) == self.num_blocks, "host slots leaked"
        assert all(h in self._slots for h in self._locked), "a locked hash was evicted"
