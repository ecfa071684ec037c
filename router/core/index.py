"""The router's mirror of the KV index: block hash -> replicas holding it, by medium.

Each replica gets a slot s and two bits in one int bitmask per block hash: bit 2s when the
replica holds the block on the device, bit 2s + 1 when it holds it on the host tier. A
prompt's cached prefix on every replica comes from one walk over its hashes with one dict
lookup per block: `alive` holds the device bit of each replica still in its device run and
the host bit of each replica in the host run after it, so "does every run go on?" is
`alive & mask == alive`; only where a run ends does the walk do more. It stops as soon as
no replica is left.

Events feed it through one `kv.events.ReplicaEventTracker` per replica (gaps, reordering
and restarts are the tracker's job); per-replica hash collections make clears, snapshots
and `remove_replica` cost what that replica held, not the whole index. They are dicts with
None values rather than sets: such dicts hold no GC-tracked objects, so CPython's cyclic
collector never walks their millions of entries (sets are always tracked, and a full
collection over them would stall a routing decision for tens of milliseconds).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence

from kv.events import MEDIA, EventBatch, Medium, ReplicaEventTracker, Snapshot
from kv.hashing import BlockHash
from router.core.hash_loops import num_leading_in
from router.core.pending import PendingMarks
from router.core.prefix_match import PrefixMatch, collect_matches

__all__ = ["PrefixIndex", "PrefixMatch"]


class _Replica:
    __slots__ = ("slot", "device_bit", "held", "tracker")

    def __init__(self, slot: int, held: dict[Medium, dict[BlockHash, None]],
                 tracker: ReplicaEventTracker):
        self.slot = slot
        self.device_bit = 1 << (2 * slot)  # the host bit is device_bit << 1
        self.held = held
        self.tracker = tracker


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
        self._masks: dict[BlockHash, int] = {}
        # One object per distinct hash, shared by every replica's contents: each replica's
        # deserialized events bring their own copies, and keeping one saves most of the
        # index's memory when blocks have several holders (and makes key compares `is`).
        self._canonical: dict[BlockHash, BlockHash] = {}
        self._device_bits = 0  # bit 2s of every slot s ever used: 0b0101...
        self._num_blocks: dict[Medium, int] = {m: 0 for m in MEDIA}  # hashes with a bit set
        self._replicas: dict[str, _Replica] = {}
        self._replica_of_slot: dict[int, str] = {}
        self._free_slots: list[int] = []  # freed by remove_replica, reused lowest first

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
        held: dict[Medium, dict[BlockHash, None]] = {m: {} for m in MEDIA}

        def on_event(medium: Medium, op: str, hashes: tuple[BlockHash, ...]) -> None:
            (self._add if op == "add" else self._remove)(rep, medium, hashes)

        def on_clear() -> None:
            for m in MEDIA:
                self._remove(rep, m, tuple(held[m]))

        rep = _Replica(slot, held, ReplicaEventTracker(on_event, on_clear))
        self._replicas[replica_id] = rep
        self._replica_of_slot[slot] = replica_id
        self._device_bits |= rep.device_bit
        return rep

    def remove_replica(self, replica_id: str) -> None:
        """Forgets everything the replica held, its pending marks and its event position."""
        rep = self._replicas.pop(replica_id, None)
        if rep is None:
            return
        for m in MEDIA:
            self._remove(rep, m, tuple(rep.held[m]))
        self.pending.forget(rep.device_bit)
        del self._replica_of_slot[rep.slot]
        self._free_slots.append(rep.slot)

    # -- feeding ---------------------------------------------------------------------------

    def apply_batch(self, batch: EventBatch) -> bool:
        """Applies one event batch. Returns True when the replica needs a snapshot (a gap, a
        restart, or a replica not synced yet)."""
        return self._replica(batch.replica_id).tracker.apply_batch(batch).needs_snapshot

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        self._replica(snapshot.replica_id).tracker.apply_snapshot(snapshot)

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

    def _add(self, rep: _Replica, medium: Medium, block_hashes: Sequence[BlockHash]) -> None:
        bit, medium_bits = self._medium_bits(rep, medium)
        masks, mine = self._masks, rep.held[medium]
        masks_get, canonical = masks.get, self._canonical.setdefault
        num_new = 0
        for h in block_hashes:
            if h not in mine:
                h = canonical(h, h)
                mine[h] = None
                m = masks_get(h, 0)
                if not m & medium_bits:
                    num_new += 1
                masks[h] = m | bit
        self._num_blocks[medium] += num_new
        if medium == "device":
            self.pending.confirm(rep.device_bit, block_hashes)

    def _remove(self, rep: _Replica, medium: Medium, block_hashes: Iterable[BlockHash]) -> None:
        bit, medium_bits = self._medium_bits(rep, medium)
        keep = ~bit
        masks, mine = self._masks, rep.held[medium]
        num_gone = 0
        for h in block_hashes:
            if h in mine:
                del mine[h]
                m = masks[h] & keep
                if not m & medium_bits:
                    num_gone += 1
                if m:
                    masks[h] = m
                else:
                    del masks[h]
                    del self._canonical[h]
        self._num_blocks[medium] -= num_gone

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
              confirmed: dict[str, int] | None = None) -> dict[str, PrefixMatch]:
        """Every candidate replica's cached prefix of the prompt, in one walk.

        Returns only replicas with at least one cached block; a candidate the index has
        never heard of has none. When `confirmed` is given, it receives, for each replica
        whose device run a pending mark carried on, how many leading blocks events confirm
        there (`num_confirmed_device_blocks` without a second walk); for the others that
        number is their `num_device_blocks`.
        """
        self.pending.expire(self.clock())
        replicas = self._replicas
        alive = 0  # device bits of runs on the device, host bits of runs on the host after it
        for rid in replica_ids:
            rep = replicas.get(rid)
            if rep is not None:
                alive |= rep.device_bit
        if not alive:
            return {}
        device_bits = self._device_bits
        masks_get = self._masks.get
        pend_by_bit, pend_bits = self.pending.by_bit, self.pending.bits_mask
        device_ends: list[tuple[int, int]] = []  # (device bits, device run length)
        total_ends: list[tuple[int, int]] = []  # (device bits, cached prefix length)
        carried = 0  # device bits whose run a pending mark has carried on
        confirmed_ends: list[tuple[int, int]] = []  # (device bit, its confirmed run length)
        for i, h in enumerate(block_hashes):
            m = masks_get(h, 0)
            if alive & m == alive:
                continue  # the common step: every run, device or host, goes on
            ending = alive & ~m
            host_ending = ending & ~device_bits
            device_ending = ending ^ host_ending
            rescued = device_ending & pend_bits
            while rescued:  # device runs about to end: does a pending mark carry them on?
                bit = rescued & -rescued
                if h in pend_by_bit[bit]:
                    device_ending ^= bit
                    if not carried & bit:
                        carried |= bit
                        confirmed_ends.append((bit, i))
                rescued ^= bit
            if device_ending:
                device_ends.append((device_ending, i))
                into_host = (device_ending << 1) & m  # a host run starts right here
                no_host_run = device_ending ^ (into_host >> 1)
                if no_host_run:
                    total_ends.append((no_host_run, i))
                alive ^= device_ending | into_host  # device bit off, host bit on
            if host_ending:
                total_ends.append((host_ending >> 1, i))
                alive ^= host_ending
            if not alive:
                break
        else:  # walked the whole prompt: whoever is left holds all of it
            n = len(block_hashes)
            device_ends.append((alive & device_bits, n))
            total_ends.append(((alive & device_bits) | ((alive >> 1) & device_bits), n))
        if confirmed is not None:
            for bit, n in confirmed_ends:
                confirmed[self._replica_of_slot[(bit.bit_length() - 1) >> 1]] = n
        return collect_matches(device_ends, total_ends, self._replica_of_slot)

    def num_confirmed_device_blocks(self, replica_id: str,
                                    block_hashes: Sequence[BlockHash]) -> int:
        """Leading blocks events confirm on the replica's device (pending marks not counted)."""
        rep = self._replicas.get(replica_id)
        if rep is None:
            return 0
        return num_leading_in(rep.held["device"], block_hashes)

    def holders(self, block_hash: BlockHash, medium: Medium = "device") -> set[str]:
        """Replicas holding the block on the medium (confirmed by events)."""
        m = self._masks.get(block_hash, 0)
        return {rid for rid, rep in self._replicas.items()
                if m & self._medium_bits(rep, medium)[0]}

    def held_view(self, replica_id: str, medium: Medium = "device") -> Collection[BlockHash]:
        """The replica's blocks as a live, read-only view (no copy): read it under the lock
        that guards the index, and do not keep it."""
        rep = self._replicas.get(replica_id)
        return rep.held[medium].keys() if rep else ()

    def blocks_of(self, replica_id: str, medium: Medium = "device") -> frozenset[BlockHash]:
        rep = self._replicas.get(replica_id)
        return frozenset(rep.held[medium]) if rep else frozenset()

    def num_blocks(self, medium: Medium = "device") -> int:
        """Distinct block hashes indexed on the medium, over all replicas."""
        return self._num_blocks[medium]

    def check_invariants(self) -> None:
        assert set(self._replica_of_slot.values()) == set(self._replicas), "slot map drifted"
        assert not set(self._free_slots) & set(self._replica_of_slot), "a slot is used and free"
        used = 0
        for rid, rep in self._replicas.items():
            assert self._replica_of_slot[rep.slot] == rid, f"{rid} slot {rep.slot} mismapped"
            assert rep.device_bit == 1 << (2 * rep.slot)
            used |= rep.device_bit
        assert used & ~self._device_bits == 0, "a slot's bit is missing from device bits"
        expected: dict[BlockHash, int] = {}
        for rep in self._replicas.values():
            for medium in MEDIA:
                bit = self._medium_bits(rep, medium)[0]
                for h in rep.held[medium]:
                    expected[h] = expected.get(h, 0) | bit
        assert all(self._masks.values()), "an empty index entry"
        assert self._canonical.keys() == self._masks.keys(), "canonical objects drifted"
        for rep in self._replicas.values():
            for medium in MEDIA:
                assert all(self._canonical[h] is h for h in rep.held[medium]), "a stray copy"
        assert self._masks == expected, "bitmasks != per-replica contents"
        for medium, medium_bits in (("device", self._device_bits),
                                    ("host", self._device_bits << 1)):
            n = sum(1 for m in self._masks.values() if m & medium_bits)
            assert self._num_blocks[medium] == n, f"{medium} block count drifted"
        self.pending.check_invariants()
        assert self.pending.bits_mask & ~used == 0, "pending marks of a removed replica"
