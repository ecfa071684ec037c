"""What the replicas hold, in the index's BlockTable: bits set and cleared, counts per medium.

The router's index (router.core.index) keeps the replicas, their event trackers, the pending
marks and the lookups; this part keeps the contents: one BlockTable (hash -> row, a row of
bits 2s / 2s + 1 per replica slot s, router.core.block_table), one HeldRows list per
(replica, medium) (router.core.held_rows), and how many distinct hashes some replica holds
on each medium. Events reach it as runs: consecutive adds (or removes) of one replica on one
medium, which commute with every other pair's, so a round of runs of many replicas is one
vectorised pass (router.core.run_apply).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from kv.events import MEDIA, Medium, ReplicaEventTracker
from kv.hashing import BlockHash
from router.core.block_table import (
    FEW_HASHES,
    BlockTable,
    check_lengths,
    key_words,
    rows_nonzero,
)
from router.core.held_rows import HeldRows
from router.core.prefix_walk import as_int
from router.core.run_apply import add_runs, remove_runs

DEVICE_WORD = np.uint64(0x5555_5555_5555_5555)  # the device bits of a mask word
_MEDIUM_BITS = {"device": int(DEVICE_WORD), "host": int(DEVICE_WORD) << 1}  # as Python ints
_JOIN_BELOW = 1024  # hashes a run: shorter runs of a round are applied joined



def none_on(medium: Medium, masks: np.ndarray) -> np.ndarray:
    """Per mask row ([n, W] uint64), True when no replica holds it on the medium."""
    medium_word = DEVICE_WORD if medium == "device" else DEVICE_WORD << np.uint64(1)
    return ~rows_nonzero(masks & medium_word)


class ReplicaContents:
    """One replica's part: its slot s, its rows per medium, and its events not applied yet
    (its tracker, kv.events.ReplicaEventTracker, is set by the index that feeds it)."""

    __slots__ = ("slot", "device_bit", "held", "runs", "tracker")

    def __init__(self, slot: int):
        self.slot = slot
        self.device_bit = 1 << (2 * slot)  # the host bit is device_bit << 1
        self.held = {"device": HeldRows(2 * slot), "host": HeldRows(2 * slot + 1)}
        # per medium, the runs of events not applied yet, in order: (op, their hashes)
        self.runs: dict[Medium, list[tuple[str, list[BlockHash]]]] = {}
        self.tracker: ReplicaEventTracker | None = None

    def queue(self, medium: Medium, op: str, hashes: Sequence[BlockHash]) -> None:
        """An event's effect (the tracker's `on_event`), queued for `apply_runs`.
        Consecutive adds (or removes) on one medium commute, and the other medium's bits
        are apart, so a run costs one vectorised update instead of one per event."""
        runs = self.runs.setdefault(medium, [])
        if runs and runs[-1][0] == op:
            runs[-1][1].extend(hashes)
        else:
            runs.append((op, list(hashes)))


def _one_by_one(runs: Sequence[tuple]) -> bool:
    """Whether a round's runs go one by one rather than joined (run_apply): a run costs
    some 15 numpy calls alone, but the joined scatter costs more a hash (its unbuffered
    `ufunc.at` and the counts over whole mask rows), so long runs go alone; and a round of
    a few hashes goes one by one, hash by hash (`FEW_HASHES`)."""
    num_hashes = sum(len(run[-1]) for run in runs)
    return (len(runs) <= 1 or num_hashes >= _JOIN_BELOW * len(runs)
            or num_hashes <= FEW_HASHES)


class ReplicaSlots:
    """Replica id <-> slot s (bits 2s and 2s + 1 of the masks): a replica keeps its slot
    while it is indexed; a freed slot is reused, lowest first."""

    def __init__(self) -> None:
        self.replica_of_slot: dict[int, str] = {}
        self._free: list[int] = []

    def take(self, replica_id: str) -> int:
        if self._free:
            self._free.sort()
            slot = self._free.pop(0)
        else:
            slot = len(self.replica_of_slot)
        self.replica_of_slot[slot] = replica_id
        return slot

    def free(self, slot: int) -> None:
        del self.replica_of_slot[slot]
        self._free.append(slot)

    def check_invariants(self, slot_of: dict[str, int]) -> None:
        """`slot_of`: the slot of every replica the index holds."""
        assert set(self.replica_of_slot.values()) == set(slot_of), "slot map drifted"
        assert not set(self._free) & set(self.replica_of_slot), "a slot is used and free"
        for rid, slot in slot_of.items():
            assert self.replica_of_slot[slot] == rid, f"{rid} slot {slot} mismapped"


class IndexContents:
    """The table, the per-medium counts, and the writes that keep them in step."""

    def __init__(self) -> None:
        self.table = BlockTable()
        self.num_blocks: dict[Medium, int] = {m: 0 for m in MEDIA}  # hashes with a bit set

    def apply_runs(self, reps: Sequence[ReplicaContents]
                   ) -> list[tuple[ReplicaContents, Medium, list[BlockHash]]]:
        """Applies the replicas' queued runs in rounds: round k takes the k-th run of every
        (replica, medium); its adds go first (a row another pair empties in the same round
        then stays, rather than being freed and interned again), then its removes. Returns
        the adds applied, (replica, medium, hashes), in order."""
        pending = [(rep, medium, runs) for rep in reps for medium, runs in rep.runs.items()]
        for rep in reps:
            rep.runs = {}
        added: list[tuple[ReplicaContents, Medium, list[BlockHash]]] = []
        for k in range(max((len(runs) for *_, runs in pending), default=0)):
            adds: list[tuple[ReplicaContents, HeldRows, Medium, list[BlockHash]]] = []
            removes: list[tuple[HeldRows, Medium, list[BlockHash]]] = []
            for rep, medium, runs in pending:
                if k < len(runs) and runs[k][1]:
                    op, hashes = runs[k]
                    if op == "add":
                        adds.append((rep, rep.held[medium], medium, hashes))
                    else:
                        removes.append((rep.held[medium], medium, hashes))
            if _one_by_one(adds):
                for _, rows, medium, hashes in adds:
                    self.add(rows, medium, hashes)
            else:
                self._count_change(add_runs(self.table, [(rows, hashes)
                                                         for _, rows, _, hashes in adds]))
            added.extend((rep, medium, hashes) for rep, _, medium, hashes in adds)
            if _one_by_one(removes):
                for rows, medium, hashes in removes:
                    self.remove(rows, medium, hashes)
            else:
                self._count_change(remove_runs(self.table, [(rows, hashes)
                                                            for rows, _, hashes in removes]))
        return added

    def _count_change(self, change: Sequence[int]) -> None:
        for medium, n in zip(MEDIA, change):
            self.num_blocks[medium] += n

    def add(self, held: HeldRows, medium: Medium, block_hashes: Sequence[BlockHash]) -> None:
        """Sets the pair's bit on the hashes' rows (interning new hashes)."""
        if not block_hashes:
            return
        if len(block_hashes) <= FEW_HASHES:
            self._add_few(held, medium, block_hashes)
            return
        table = self.table
        rows = table.intern(key_words(block_hashes))
        new = table.unique_rows(rows[(table.masks[rows, held.word] & held.bit) == 0])
        if new.size:
            masks = table.masks_of(new)
            self.num_blocks[medium] += int(np.count_nonzero(none_on(medium, masks)))
            # the rows' words are in hand: a scatter, not a second gather and a scatter
            table.masks[new, held.word] = masks[:, held.word] | held.bit
            held.append(new)

    def _add_few(self, held: HeldRows, medium: Medium, block_hashes: Sequence[BlockHash]
                 ) -> None:
        """`add` hash by hash, in Python ints: an array pass costs 30-60 numpy calls
        whatever its size, which made a poll's few events (a back-to-back request stores
        and evicts a few blocks) cost a router 0.2-0.4 ms a run to apply."""
        check_lengths(block_hashes)  # all first: a bad hash changes nothing, as key_words
        table, word, bit, on_medium = self.table, held.word, int(held.bit), _MEDIUM_BITS[medium]
        new = []
        for block_hash in block_hashes:
            row = table.intern_one(block_hash)
            words = table.masks[row].tolist()
            if words[word] & bit:
                continue  # held already (or twice in the run)
            if not any(w & on_medium for w in words):
                self.num_blocks[medium] += 1
            table.masks[row, word] = words[word] | bit
            new.append(row)
        if new:
            held.append(np.array(new, np.int32))

    def remove(self, held: HeldRows, medium: Medium, block_hashes: Iterable[BlockHash]) -> None:
        """Clears the pair's bit on the hashes' rows (absent hashes are skipped)."""
        if isinstance(block_hashes, (list, tuple)) and len(block_hashes) <= FEW_HASHES:
            self._remove_few(held, medium, block_hashes)
            return
        keys = key_words(block_hashes)
        if len(keys):
            self.remove_rows(held, medium, self.table.unique_rows(self.table.lookup(keys)))

    def _remove_few(self, held: HeldRows, medium: Medium, block_hashes: Sequence[BlockHash]
                    ) -> None:
        """`remove` hash by hash, in Python ints."""
        check_lengths(block_hashes)
        table, word, bit, on_medium = self.table, held.word, int(held.bit), _MEDIUM_BITS[medium]
        removed = 0
        for block_hash in block_hashes:
            row = table.lookup_one(block_hash)
            if row is None:
                continue
            words = table.masks[row].tolist()
            if not words[word] & bit:
                continue  # not held (or twice in the run)
            words[word] ^= bit
            table.masks[row, word] = words[word]
            removed += 1
            if not any(w & on_medium for w in words):
                self.num_blocks[medium] -= 1
            if not any(words):
                table.free_one(row)
        if removed:
            held.count -= removed
            held.compact(table)

    def remove_rows(self, held: HeldRows, medium: Medium, rows: np.ndarray) -> None:
        """Clears the pair's bit on rows (unique; rows it does not hold are skipped) and
        frees the rows nobody holds any more."""
        table = self.table
        rows = rows[(table.masks[rows, held.word] & held.bit) != 0]
        if not rows.size:
            return
        table.masks[rows, held.word] &= ~held.bit
        left = table.masks_of(rows)
        self.num_blocks[medium] -= int(np.count_nonzero(none_on(medium, left)))
        held.count -= len(rows)
        table.free(rows[~rows_nonzero(left)])
        held.compact(table)

    def clear(self, held: dict[Medium, HeldRows]) -> None:
        """Everything one replica holds, on every medium, is gone."""
        for medium, rows in held.items():
            self.remove_rows(rows, medium, rows.held(self.table).astype(np.intp))
            rows.clear()

    def num_leading_held(self, held: HeldRows, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading hashes the pair holds."""
        rows = self.table.lookup_hashes(block_hashes)
        missing = np.flatnonzero((self.table.masks[rows, held.word] & held.bit) == 0)
        return int(missing[0]) if missing.size else len(block_hashes)

    def bits_of(self, block_hash: BlockHash) -> int:
        """The hash's mask as one int (0: nobody holds it)."""
        row = self.table.lookup_one(block_hash)
        return 0 if row is None else as_int(self.table.masks[row])

    def hashes_held(self, held: HeldRows) -> list[BlockHash]:
        return self.table.hashes(held.held(self.table))

    def nbytes(self, helds: Iterable[HeldRows]) -> int:
        return self.table.nbytes() + sum(held.nbytes() for held in helds)

    def check_invariants(self, helds: Iterable[HeldRows]) -> None:
        """`helds`: every (replica, medium) list of the index."""
        table = self.table
        table.check_invariants()
        masks = table.masks
        expected = np.zeros_like(masks)
        for held in helds:
            rows = held.held(table)
            assert len(rows) == held.count, "a replica's row count drifted"
            expected[rows, held.word] |= held.bit
        assert (expected == masks).all(), "bitmasks != per-replica contents"
        for medium in MEDIA:
            n = int(np.count_nonzero(~none_on(medium, masks)))
            assert self.num_blocks[medium] == n, f"{medium} block count drifted"
