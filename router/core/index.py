"""The router's mirror of the KV index: block hash -> replicas holding it, by medium.

Each replica gets a slot s and two bits in one bitmask per block hash: bit 2s when the
replica holds the block on the device, bit 2s + 1 when it holds it on the host tier. The
hashes and their bitmasks live in flat numpy arrays (router.core.block_table): 27 B per
holding at 256 replicas and 4M blocks, where Python objects took 81. A prompt's cached
prefix on every replica comes from a vectorised lookup of its hashes (a first chunk, the
rest only if some run reaches past it), then a walk over the few blocks where some
candidate's bits change (router.core.prefix_walk).

Events feed it through one `kv.events.ReplicaEventTracker` per replica (gaps, reordering
and restarts are the tracker's job); per-replica row lists (router.core.held_rows) make
clears, snapshots and `remove_replica` cost what that replica held, not the whole index.
The arrays hold no Python objects, so CPython's cyclic collector never walks them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence

import numpy as np

from kv.events import MEDIA, EventBatch, Medium, ReplicaEventTracker, Snapshot
from kv.hashing import BlockHash
from router.core.block_table import SLOTS_PER_WORD, BlockTable, key_words, rows_nonzero
from router.core.held_rows import HeldRows, HeldView
from router.core.pending import PendingMarks
from router.core.prefix_match import PrefixMatch, PrefixMatches
from router.core.prefix_walk import PrefixWalk, as_int
from router.core.run_apply import add_runs, remove_runs

__all__ = ["PrefixIndex", "PrefixMatch"]

_DEVICE_WORD = np.uint64(0x5555_5555_5555_5555)  # the device bits of a mask word
_NO_RUNS = np.zeros(0, np.int64)
_FIRST_CHUNK_BLOCKS = 32  # blocks of a prompt looked up before the rest (see `match`)


class _Replica:
    __slots__ = ("slot", "device_bit", "held", "tracker", "runs")

    def __init__(self, slot: int, held: dict[Medium, HeldRows],
                 tracker: ReplicaEventTracker):
        self.slot = slot
        self.device_bit = 1 << (2 * slot)  # the host bit is device_bit << 1
        self.held = held
        self.tracker = tracker
        # per medium, the runs of events not applied yet, in order: (op, their hashes)
        self.runs: dict[Medium, list[tuple[str, list[BlockHash]]]] = {}


class PrefixIndex:
    """Block hash -> bitmask of (replica, medium), plus pending marks.

    Args:
        pending_ttl_s: how long a pending mark lives without a confirming event.
        clock: seconds, monotonic; injectable so tests and the simulator drive time.
    """

    def __init__(self, pending_ttl_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.pending = PendingMarks(pending_ttl_s)
        self._table = BlockTable()
        self._device_bits = 0  # bit 2s of every slot s ever used: 0b0101...
        self._num_blocks: dict[Medium, int] = {m: 0 for m in MEDIA}  # hashes with a bit set
        self._replicas: dict[str, _Replica] = {}
        self._replica_of_slot: dict[int, str] = {}
        self._free_slots: list[int] = []  # freed by remove_replica, reused lowest first
        # the last candidate list matched and its replicas' device bits (a router passes the
        # same list decision after decision); dropped when a replica comes or goes
        self._candidates: tuple[tuple[str, ...], int] = ((), 0)

    # -- replicas --------------------------------------------------------------------------

    @property
    def replica_ids(self) -> list[str]:
        return list(self._replicas)

    def __contains__(self, replica_id: str) -> bool:
        return replica_id in self._replicas

    def next_seq(self, replica_id: str) -> int | None:
        """The sequence number of the next event expected from the replica (None: unknown)."""
        rep = self._replicas.get(replica_id)
        return rep.tracker.next_seq if rep is not None else None

    def slot_of(self, replica_id: str) -> int:
        """The replica's slot, allocating one (and an unsynced tracker) on first sight."""
        return self._replica(replica_id).slot

    def _replica(self, replica_id: str) -> _Replica:
        rep = self._replicas.get(replica_id)
        if rep is not None:
            return rep
        if self._free_slots:
            self._free_slots.sort()
            slot = self._free_slots.pop(0)
        else:
            slot = len(self._replica_of_slot)
        if slot >= SLOTS_PER_WORD * self._table.num_words:
            self._table.widen(slot // SLOTS_PER_WORD + 1)
        held = {"device": HeldRows(2 * slot), "host": HeldRows(2 * slot + 1)}

        def on_event(medium: Medium, op: str, hashes: tuple[BlockHash, ...]) -> None:
            # Events are applied in runs: consecutive adds (or removes) on one medium
            # commute, and the other medium's bits are apart, so a run costs one vectorised
            # update instead of one per event (and `_apply_runs` takes many replicas' at once).
            runs = rep.runs.setdefault(medium, [])
            if runs and runs[-1][0] == op:
                runs[-1][1].extend(hashes)
            else:
                runs.append((op, list(hashes)))

        def on_clear() -> None:
            self._apply_runs([rep])  # the adds confirm pending marks, which a clear keeps
            self._clear(rep)

        rep = _Replica(slot, held, ReplicaEventTracker(on_event, on_clear))
        self._replicas[replica_id] = rep
        self._replica_of_slot[slot] = replica_id
        self._device_bits |= rep.device_bit
        self._candidates = ((), 0)
        return rep

    def remove_replica(self, replica_id: str) -> None:
        """Forgets everything the replica held, its pending marks and its event position."""
        rep = self._replicas.pop(replica_id, None)
        if rep is None:
            return
        self._clear(rep)
        self.pending.forget(rep.device_bit)
        del self._replica_of_slot[rep.slot]
        self._free_slots.append(rep.slot)
        self._candidates = ((), 0)

    # -- feeding ---------------------------------------------------------------------------

    def apply_batch(self, batch: EventBatch) -> bool:
        """Applies one event batch. Returns True when the replica needs a snapshot (a gap, a
        restart, or a replica not synced yet)."""
        return self.apply_batches([batch])[0]

    def apply_batches(self, batches: Sequence[EventBatch]) -> list[bool]:
        """Applies event batches of any replicas, in order for each replica; the same as
        `apply_batch` on each in turn, in a few vectorised passes for all of them. Returns,
        per batch, whether its replica needs a snapshot."""
        needs_snapshot, reps = [], {}
        for batch in batches:
            rep = self._replica(batch.replica_id)
            needs_snapshot.append(rep.tracker.apply_batch(batch).needs_snapshot)
            reps[batch.replica_id] = rep
        self._apply_runs(list(reps.values()))
        return needs_snapshot

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        rep = self._replica(snapshot.replica_id)
        rep.tracker.apply_snapshot(snapshot)
        self._apply_runs([rep])

    def _apply_runs(self, reps: Sequence[_Replica]) -> None:
        """Applies the replicas' queued runs in rounds: round k takes the k-th run of every
        (replica, medium); its adds go first (a row another pair empties in the same round
        then stays, rather than being freed and interned again), then its removes."""
        pending = [(rep, medium, runs) for rep in reps for medium, runs in rep.runs.items()]
        for rep in reps:
            rep.runs = {}
        for k in range(max((len(runs) for _, _, runs in pending), default=0)):
            adds: list[tuple[_Replica, Medium, list[BlockHash]]] = []
            removes: list[tuple[_Replica, Medium, list[BlockHash]]] = []
            for rep, medium, runs in pending:
                if k < len(runs) and runs[k][1]:
                    op, hashes = runs[k]
                    (adds if op == "add" else removes).append((rep, medium, hashes))
            if len(adds) == 1:
                self._add(*adds[0])
            elif adds:
                self._count_change(add_runs(self._table, [(rep.held[medium], hashes)
                                                          for rep, medium, hashes in adds]))
                for rep, medium, hashes in adds:
                    self._confirm(rep, medium, hashes)
            if len(removes) == 1:
                self._remove(*removes[0])
            elif removes:
                self._count_change(remove_runs(self._table, [(rep.held[medium], hashes)
                                                             for rep, medium, hashes in removes]))

    def _count_change(self, change: Sequence[int]) -> None:
        for medium, n in zip(MEDIA, change):
            self._num_blocks[medium] += n

    def add_blocks(self, replica_id: str, medium: Medium, block_hashes: Sequence[BlockHash]
                   ) -> None:
        """Records blocks directly, without events (the approximate, history-fed index)."""
        self._add(self._replica(replica_id), medium, block_hashes)

    def remove_blocks(self, replica_id: str, medium: Medium,
                      block_hashes: Iterable[BlockHash]) -> None:
        rep = self._replicas.get(replica_id)
        if rep is not None:
            self._remove(rep, medium, block_hashes)

    def _medium_bits(self, rep: _Replica, medium: Medium) -> tuple[int, int]:
        """(the replica's bit for the medium, the bits of every replica for it)."""
        if medium == "device":
            return rep.device_bit, self._device_bits
        return rep.device_bit << 1, self._device_bits << 1

    def _none_on(self, medium: Medium, masks: np.ndarray) -> np.ndarray:
        """Per mask row ([n, W] uint64), True when no replica holds it on the medium."""
        medium_word = _DEVICE_WORD if medium == "device" else _DEVICE_WORD << np.uint64(1)
        return ~rows_nonzero(masks & medium_word)

    def _add(self, rep: _Replica, medium: Medium, block_hashes: Sequence[BlockHash]) -> None:
        if not block_hashes:
            return
        table, held = self._table, rep.held[medium]
        rows = table.intern(key_words(block_hashes))
        new = table.unique_rows(rows[(table.masks[rows, held.word] & held.bit) == 0])
        if new.size:
            self._num_blocks[medium] += int(np.count_nonzero(
                self._none_on(medium, table.masks_of(new))))
            table.masks[new, held.word] |= held.bit
            held.append(new)
        self._confirm(rep, medium, block_hashes)

    def _confirm(self, rep: _Replica, medium: Medium, block_hashes: Sequence[BlockHash]) -> None:
        """Stored blocks end the replica's pending marks on them."""
        if medium == "device" and rep.device_bit in self.pending.by_bit:
            # each once: a run of events may store a hash twice, and confirm deletes per hash
            self.pending.confirm(rep.device_bit, list(dict.fromkeys(block_hashes)))

    def _remove(self, rep: _Replica, medium: Medium, block_hashes: Iterable[BlockHash]) -> None:
        keys = key_words(block_hashes)
        if len(keys):
            self._remove_rows(rep, medium, self._table.unique_rows(self._table.lookup(keys)))

    def _remove_rows(self, rep: _Replica, medium: Medium, rows: np.ndarray) -> None:
        """Clears the replica's bit on rows (unique; rows it does not hold are skipped)."""
        table, held = self._table, rep.held[medium]
        rows = rows[(table.masks[rows, held.word] & held.bit) != 0]
        if not rows.size:
            return
        table.masks[rows, held.word] &= ~held.bit
        left = table.masks_of(rows)
        self._num_blocks[medium] -= int(np.count_nonzero(self._none_on(medium, left)))
        held.count -= len(rows)
        table.free(rows[~rows_nonzero(left)])
        held.compact(table)

    def _clear(self, rep: _Replica) -> None:
        for medium, held in rep.held.items():
            self._remove_rows(rep, medium, held.held(self._table).astype(np.intp))
            held.clear()

    # -- pending marks ---------------------------------------------------------------------

    def mark_pending(self, replica_id: str, block_hashes: Sequence[BlockHash],
                     held: bool = False) -> None:
        """Marks blocks as about to be computed on the replica (see router.core.pending): held
        until `release_pending` with the same blocks, or for the TTL."""
        now = self.clock()
        self.pending.expire(now)
        bit = self._replica(replica_id).device_bit
        if held:
            self.pending.hold(bit, block_hashes)
        else:
            self.pending.mark(bit, block_hashes, now)

    def release_pending(self, replica_id: str, block_hashes: Sequence[BlockHash],
                        withdraw: bool = False) -> None:
        """The request that held these marks finished: their TTL starts now; or, with
        `withdraw`, it never went there: the marks only it held end now."""
        rep = self._replicas.get(replica_id)
        if rep is not None:
            self.pending.release(rep.device_bit, block_hashes, self.clock(), withdraw)

    def pending_blocks(self, replica_id: str) -> frozenset[BlockHash]:
        rep = self._replicas.get(replica_id)
        return self.pending.marked(rep.device_bit) if rep else frozenset()

    # -- lookups ---------------------------------------------------------------------------

    def match(self, block_hashes: Sequence[BlockHash], replica_ids: Iterable[str],
              confirmed: dict[str, int] | None = None) -> PrefixMatches:
        """Every candidate replica's cached prefix of the prompt, in one walk.

        Returns only replicas with at least one cached block; a candidate the index has
        never heard of has none. When `confirmed` is given, it receives, for each replica
        whose device run a pending mark carried on, how many leading blocks events confirm
        there (`num_confirmed_device_blocks` without a second walk); for the others that
        number is their `num_device_blocks`.
        """
        self.pending.expire(self.clock())
        candidates = self._candidate_bits(replica_ids)
        if not candidates or not block_hashes:
            return PrefixMatches([], _NO_RUNS, _NO_RUNS)
        table, pending = self._table, self.pending
        keys = key_words(block_hashes)
        # Most prompts' cached prefixes end early (every miss at its first block): look up
        # a first chunk, and the rest only if some run reaches the chunk's end.
        masks = table.masks_of(table.lookup(keys[:_FIRST_CHUNK_BLOCKS]))
        walk = PrefixWalk(candidates, block_hashes, pending)
        walk.walk(masks)
        if walk.going and len(keys) > len(masks):
            walk.walk(np.concatenate((masks, table.masks_of(table.lookup(keys[len(masks):])))))
        slots, device_runs, total_runs, carried = walk.runs()
        replica_of_slot = self._replica_of_slot
        if confirmed is not None:
            for slot, num_blocks in carried.items():
                confirmed[replica_of_slot[slot]] = num_blocks
        return PrefixMatches(list(map(replica_of_slot.__getitem__, slots.tolist())),
                             device_runs, total_runs)

    def _candidate_bits(self, replica_ids: Iterable[str]) -> int:
        """The device bits of the candidates the index knows."""
        key = tuple(replica_ids)
        listed, bits = self._candidates
        if key != listed:
            replicas, bits = self._replicas, 0
            for rid in key:
                rep = replicas.get(rid)
                if rep is not None:
                    bits |= rep.device_bit
            self._candidates = (key, bits)
        return bits

    def num_confirmed_device_blocks(self, replica_id: str,
                                    block_hashes: Sequence[BlockHash]) -> int:
        """Leading blocks events confirm on the replica's device (pending marks not counted)."""
        rep = self._replicas.get(replica_id)
        if rep is None or not block_hashes:
            return 0
        held = rep.held["device"]
        rows = self._table.lookup(key_words(block_hashes))
        missing = np.flatnonzero((self._table.masks[rows, held.word] & held.bit) == 0)
        return int(missing[0]) if missing.size else len(block_hashes)

    def holders(self, block_hash: BlockHash, medium: Medium = "device") -> set[str]:
        """Replicas holding the block on the medium (confirmed by events)."""
        row = self._table.lookup_one(block_hash)
        if row is None:
            return set()
        m = as_int(self._table.masks[row])
        return {rid for rid, rep in self._replicas.items()
                if m & self._medium_bits(rep, medium)[0]}

    def held_view(self, replica_id: str, medium: Medium = "device") -> Collection[BlockHash]:
        """The replica's blocks as a live, read-only view (no copy): read it under the lock
        that guards the index, and do not keep it."""
        rep = self._replicas.get(replica_id)
        return HeldView(self._table, rep.held[medium]) if rep else ()

    def blocks_of(self, replica_id: str, medium: Medium = "device") -> frozenset[BlockHash]:
        rep = self._replicas.get(replica_id)
        if rep is None:
            return frozenset()
        return frozenset(self._table.hashes(rep.held[medium].held(self._table)))

    def num_blocks(self, medium: Medium = "device") -> int:
        """Distinct block hashes indexed on the medium, over all replicas."""
        return self._num_blocks[medium]

    def num_distinct_blocks(self) -> int:
        """Distinct block hashes indexed on either medium."""
        return self._table.num_live

    def nbytes(self) -> int:
        """Bytes of the arrays holding hashes, bitmasks and per-replica rows."""
        return self._table.nbytes() + sum(held.nbytes() for rep in self._replicas.values()
                                          for held in rep.held.values())

    def check_invariants(self) -> None:
        assert set(self._replica_of_slot.values()) == set(self._replicas), "slot map drifted"
        assert not set(self._free_slots) & set(self._replica_of_slot), "a slot is used and free"
        used = 0
        for rid, rep in self._replicas.items():
            assert self._replica_of_slot[rep.slot] == rid, f"{rid} slot {rep.slot} mismapped"
            assert rep.device_bit == 1 << (2 * rep.slot)
            used |= rep.device_bit
        assert used & ~self._device_bits == 0, "a slot's bit is missing from device bits"
        table = self._table
        table.check_invariants()
        masks = table.masks
        expected = np.zeros_like(masks)
        for rep in self._replicas.values():
            for held in rep.held.values():
                rows = held.held(table)
                assert len(rows) == held.count, "a replica's row count drifted"
                expected[rows, held.word] |= held.bit
        assert (expected == masks).all(), "bitmasks != per-replica contents"
        for medium in MEDIA:
            n = int(np.count_nonzero(~self._none_on(medium, masks)))
            assert self._num_blocks[medium] == n, f"{medium} block count drifted"
        self.pending.check_invariants()
        assert self.pending.bits_mask & ~used == 0, "pending marks of a removed replica"
