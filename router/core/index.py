"""The router's mirror of the KV index: block hash -> replicas holding it, by medium.

Each replica gets a slot s and two bits in one bitmask per block hash: bit 2s when the
replica holds the block on the device, bit 2s + 1 when it holds it on the host tier. The
hashes and their bitmasks live in flat numpy arrays (router.core.block_table): 27 B per
holding at 256 replicas and 4M blocks, where Python objects took 81. A prompt's cached
prefix on every replica comes from one vectorised lookup of all its hashes, then a walk
over the few blocks where some candidate's bits change (router.core.prefix_walk); a short
prompt's from a walk of its blocks one by one (router.core.short_walk).

Events feed it through one `kv.events.ReplicaEventTracker` per replica (gaps, reordering
and restarts are the tracker's job) into the contents (router.core.index_contents: the
table, per-replica row lists that make clears, snapshots and `remove_replica` cost what
that replica held, and the runs of events applied many replicas at once).
The arrays hold no Python objects, so CPython's cyclic collector never walks them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from kv.events import EventBatch, Medium, ReplicaEventTracker, Snapshot
from kv.hashing import BlockHash
from router.core.block_table import FEW_HASHES, SLOTS_PER_WORD
from router.core.held_rows import HeldRows, HeldView
from router.core.index_contents import IndexContents, ReplicaContents, ReplicaSlots
from router.core.pending import PendingMarks
from router.core.prefix_match import PrefixMatch
from router.core.prefix_walk import PrefixWalk
from router.core.short_walk import walk_short

__all__ = ["PrefixIndex", "PrefixMatch"]


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
        self._contents = IndexContents()
        self._table = self._contents.table
        self._replicas: dict[str, ReplicaContents] = {}
        self._slots = ReplicaSlots()
        # the last candidate list matched, its replicas' device bits, and whether they are
        # every replica's here (a router passes the same list decision after decision);
        # dropped when a replica comes or goes
        self._candidates: tuple[tuple[str, ...], int, bool] = ((), 0, False)

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

    def _replica(self, replica_id: str) -> ReplicaContents:
        rep = self._replicas.get(replica_id)
        if rep is not None:
            return rep
        slot = self._slots.take(replica_id)
        if slot >= SLOTS_PER_WORD * self._table.num_words:
            self._table.widen(slot // SLOTS_PER_WORD + 1)
        rep = ReplicaContents(slot)

        def on_clear() -> None:
            self._apply_runs([rep])  # the adds confirm pending marks, which a clear keeps
            self._contents.clear(rep.held)

        # events queue runs, applied once a batch (or a poll's batches) is in
        rep.tracker = ReplicaEventTracker(rep.queue, on_clear)
        self._replicas[replica_id] = rep
        self._candidates = ((), 0, False)
        return rep

    def remove_replica(self, replica_id: str) -> None:
        """Forgets everything the replica held, its pending marks and its event position."""
        rep = self._replicas.pop(replica_id, None)
        if rep is None:
            return
        self._contents.clear(rep.held)
        self.pending.forget(rep.device_bit)
        self._slots.free(rep.slot)
        self._candidates = ((), 0, False)

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

    def _apply_runs(self, reps: Sequence[ReplicaContents]) -> None:
        """Applies the replicas' queued runs (IndexContents.apply_runs); the blocks they
        store end the replicas' pending marks on them."""
        for rep, medium, hashes in self._contents.apply_runs(reps):
            self._confirm(rep, medium, hashes)

    def add_blocks(self, replica_id: str, medium: Medium, block_hashes: Sequence[BlockHash]
                   ) -> None:
        """Records blocks directly, without events (the approximate, history-fed index)."""
        rep = self._replica(replica_id)
        self._contents.add(rep.held[medium], medium, block_hashes)
        self._confirm(rep, medium, block_hashes)

    def remove_blocks(self, replica_id: str, medium: Medium,
                      block_hashes: Iterable[BlockHash]) -> None:
        rep = self._replicas.get(replica_id)
        if rep is not None:
            self._contents.remove(rep.held[medium], medium, block_hashes)

    def _confirm(self, rep: ReplicaContents, medium: Medium,
                 block_hashes: Sequence[BlockHash]) -> None:
        """Stored blocks end the replica's pending marks on them."""
        if medium == "device" and rep.device_bit in self.pending.by_bit:
            # each once: a run of events may store a hash twice, and confirm deletes per hash
            self.pending.confirm(rep.device_bit, list(dict.fromkeys(block_hashes)))

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
              confirmed: dict[str, int] | None = None) -> Mapping[str, PrefixMatch]:
        """Every candidate replica's cached prefix of the prompt, in one walk.

        Returns only replicas with at least one cached block (a dict when they are few;
        arrays, `PrefixMatches`, when many); a candidate the index has never heard of has
        none. When `confirmed` is given, it receives, for each replica
        whose device run a pending mark carried on, how many leading blocks events confirm
        there (`num_confirmed_device_blocks` without a second walk); for the others that
        number is their `num_device_blocks`.
        """
        self.pending.expire(self.clock())
        candidates, are_all = self._candidate_bits(replica_ids)
        if not candidates or not block_hashes:
            return {}
        table, pending = self._table, self.pending
        replica_of_slot = self._slots.replica_of_slot
        if len(block_hashes) <= FEW_HASHES:  # hash by hash: no array call pays its way
            matches, carried = walk_short(block_hashes, self._contents.bits_of, candidates,
                                          pending, replica_of_slot)
        else:
            # One lookup of every hash, even when a miss's runs all end at its first block:
            # a lookup's fixed cost (some 30 numpy calls) is most of it for a prompt's 512
            # hashes, and a first chunk then the rest paid it twice for every hit, which
            # set the p99 (64 x 1M, the match alone: p99 1,065 against 1,271 us, misses'
            # 840-930 against 650-690).
            walk = PrefixWalk(candidates, block_hashes, pending, are_all)
            walk.walk(table.masks_of(table.lookup_hashes(block_hashes)))
            matches, carried = walk.runs(replica_of_slot)
        if confirmed is not None:
            confirmed.update(carried)
        return matches

    def _candidate_bits(self, replica_ids: Iterable[str]) -> tuple[int, bool]:
        """(the device bits of the candidates the index knows, whether they are all the
        replicas it knows)."""
        key = tuple(replica_ids)
        listed, bits, are_all = self._candidates
        if key != listed:
            replicas, bits = self._replicas, 0
            for rid in key:
                rep = replicas.get(rid)
                if rep is not None:
                    bits |= rep.device_bit
            are_all = bits == sum(rep.device_bit for rep in replicas.values())
            self._candidates = (key, bits, are_all)
        return bits, are_all

    def num_confirmed_device_blocks(self, replica_id: str,
                                    block_hashes: Sequence[BlockHash]) -> int:
        """Leading blocks events confirm on the replica's device (pending marks not counted)."""
        rep = self._replicas.get(replica_id)
        if rep is None or not block_hashes:
            return 0
        return self._contents.num_leading_held(rep.held["device"], block_hashes)

    def holders(self, block_hash: BlockHash, medium: Medium = "device") -> set[str]:
        """Replicas holding the block on the medium (confirmed by events)."""
        bits = self._contents.bits_of(block_hash) >> (1 if medium == "host" else 0)
        return {rid for rid, rep in self._replicas.items() if bits & rep.device_bit}

    def held_view(self, replica_id: str, medium: Medium = "device") -> Collection[BlockHash]:
        """The replica's blocks as a live, read-only view (no copy): read it under the lock
        that guards the index, and do not keep it."""
        rep = self._replicas.get(replica_id)
        return HeldView(self._table, rep.held[medium]) if rep else ()

    def blocks_of(self, replica_id: str, medium: Medium = "device") -> frozenset[BlockHash]:
        rep = self._replicas.get(replica_id)
        if rep is None:
            return frozenset()
        return frozenset(self._contents.hashes_held(rep.held[medium]))

    def num_blocks(self, medium: Medium = "device") -> int:
        """Distinct block hashes indexed on the medium, over all replicas."""
        return self._contents.num_blocks[medium]

    def num_distinct_blocks(self) -> int:
        """Distinct block hashes indexed on either medium."""
        return self._table.num_live

    def nbytes(self) -> int:
        """Bytes of the arrays holding hashes, bitmasks and per-replica rows."""
        return self._contents.nbytes(self._helds())

    def _helds(self) -> list[HeldRows]:
        return [held for rep in self._replicas.values() for held in rep.held.values()]

    def check_invariants(self) -> None:
        self._slots.check_invariants({rid: rep.slot for rid, rep in self._replicas.items()})
        used = 0
        for rep in self._replicas.values():
            assert rep.device_bit == 1 << (2 * rep.slot)
            used |= rep.device_bit
        self._contents.check_invariants(self._helds())
        self.pending.check_invariants()
        assert self.pending.bits_mask & ~used == 0, "pending marks of a removed replica"
