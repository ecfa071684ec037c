"""The router's mirror of the KV index: block hash -> replicas holding it, by medium.

Each replica gets a slot; each indexed hash maps to an int bitmask of the slots holding it
(one dict per medium). A prompt's cached prefix on every replica comes from one walk over
its hashes: AND the masks as you go and stop as soon as no replica is left.

Events feed it through one `kv.events.ReplicaEventTracker` per replica (gaps, reordering
and restarts are the tracker's job); per-replica hash sets make clears, snapshots and
`remove_replica` cost what that replica held, not the whole index.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from kv.events import MEDIA, EventBatch, Medium, ReplicaEventTracker, Snapshot
from kv.hashing import BlockHash
from router.pending import PendingMarks


class PrefixMatch(NamedTuple):
    """A replica's cached prefix of a prompt, as the engine's `KVCacheManager.match` sees it:
    a run of device blocks (pending marks count as device), then a run of host blocks."""

    num_device_blocks: int
    num_host_blocks: int

    @property
    def num_cached_blocks(self) -> int:
        return self.num_device_blocks + self.num_host_blocks

    def hit_tokens(self, block_size: int, num_prompt_tokens: int) -> tuple[int, int]:
        """(device, host) prompt tokens this prefix covers, capped at the prompt length."""
        device_tokens = min(self.num_device_blocks * block_size, num_prompt_tokens)
        host_tokens = min(self.num_host_blocks * block_size, num_prompt_tokens - device_tokens)
        return device_tokens, host_tokens


class _Replica:
    __slots__ = ("slot", "held", "tracker")

    def __init__(self, slot: int, held: dict[Medium, dict[BlockHash, None]],
                 tracker: ReplicaEventTracker):
        self.slot = slot
        self.held = held
        self.tracker = tracker


class PrefixIndex:
    """Block hash -> bitmask of replica slots, per medium, plus pending marks.

    Args:
        pending_ttl_s: how long a pending mark lives without a confirming event.
        clock: seconds, monotonic; injectable so tests and the simulator drive time.
    """

    def __init__(self, pending_ttl_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.pending = PendingMarks(pending_ttl_s)
        self._masks: dict[Medium, dict[BlockHash, int]] = {m: {} for m in MEDIA}
        self._replicas: dict[str, _Replica] = {}
        self._replica_of_slot: dict[int, str] = {}
        self._free_slots: list[int] = []  # freed by remove_replica, reused lowest first

    # -- replicas --------------------------------------------------------------------------

    @property
    def replica_ids(self) -> list[str]:
        return list(self._replicas)

    def __contains__(self, replica_id: str) -> bool:
        return replica_id in self._replicas

    def is_synced(self, replica_id: str) -> bool:
        """True once the replica's events are applied from a snapshot on (no open gap)."""
        rep = self._replicas.get(replica_id)
        return rep is not None and rep.tracker.synced

    def next_seq(self, replica_id: str) -> int | None:
        """The sequence number of the next event expected from the replica (None: unknown)."""
        rep = self._replicas.get(replica_id)
        return rep.tracker.next_seq if rep is not None else None

    def slot_of(self, replica_id: str) -> int:
        """The replica's slot, allocating one (and an unsynced tracker) on first sight."""
        rep = self._replicas.get(replica_id)
        return (rep or self._add_replica(replica_id)).slot

    def _add_replica(self, replica_id: str) -> _Replica:
        if self._free_slots:
            self._free_slots.sort()
            slot = self._free_slots.pop(0)
        else:
            slot = len(self._replica_of_slot)
        held: dict[Medium, dict[BlockHash, None]] = {m: {} for m in MEDIA}

        def on_event(medium: Medium, op: str, hashes: tuple[BlockHash, ...]) -> None:
            (self._add if op == "add" else self._remove)(slot, held, medium, hashes)

        def on_clear(medium: Medium | None) -> None:
            for m in MEDIA if medium is None else (medium,):
                self._remove(slot, held, m, tuple(held[m]))

        rep = _Replica(slot, held, ReplicaEventTracker(on_event, on_clear))
        self._replicas[replica_id] = rep
        self._replica_of_slot[slot] = replica_id
        return rep

    def remove_replica(self, replica_id: str) -> None:
        """Forgets everything the replica held, its pending marks and its event position."""
        rep = self._replicas.pop(replica_id, None)
        if rep is None:
            return
        for m in MEDIA:
            self._remove(rep.slot, rep.held, m, tuple(rep.held[m]))
        self.pending.forget_slot(rep.slot)
        del self._replica_of_slot[rep.slot]
        self._free_slots.append(rep.slot)

    # -- feeding ---------------------------------------------------------------------------

    def apply_batch(self, batch: EventBatch) -> bool:
        """Applies one event batch. Returns True when the replica needs a snapshot (a gap, a
        restart, or a replica not synced yet)."""
        rep = self._replicas.get(batch.replica_id) or self._add_replica(batch.replica_id)
        return rep.tracker.apply_batch(batch).needs_snapshot

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        rep = self._replicas.get(snapshot.replica_id) or self._add_replica(snapshot.replica_id)
        rep.tracker.apply_snapshot(snapshot)

    def add_blocks(self, replica_id: str, medium: Medium, block_hashes: Sequence[BlockHash]
                   ) -> None:
        """Records blocks directly, without events (the approximate, history-fed index)."""
        rep = self._replicas.get(replica_id) or self._add_replica(replica_id)
        self._add(rep.slot, rep.held, medium, block_hashes)

    def remove_blocks(self, replica_id: str, medium: Medium,
                      block_hashes: Iterable[BlockHash]) -> None:
        rep = self._replicas.get(replica_id)
        if rep is not None:
            self._remove(rep.slot, rep.held, medium, block_hashes)

    def _add(self, slot: int, held: dict[Medium, dict[BlockHash, None]], medium: Medium,
             block_hashes: Sequence[BlockHash]) -> None:
        bit = 1 << slot
        masks, mine = self._masks[medium], held[medium]
        for h in block_hashes:
            if h not in mine:
                mine[h] = None
                masks[h] = masks.get(h, 0) | bit
        if medium == "device":
            self.pending.confirm(slot, block_hashes)

    def _remove(self, slot: int, held: dict[Medium, dict[BlockHash, None]], medium: Medium,
                block_hashes: Iterable[BlockHash]) -> None:
        keep = ~(1 << slot)
        masks, mine = self._masks[medium], held[medium]
        for h in block_hashes:
            if h in mine:
                del mine[h]
                m = masks[h] & keep
                if m:
                    masks[h] = m
                else:
                    del masks[h]

    # -- pending marks ---------------------------------------------------------------------

    def mark_pending(self, replica_id: str, block_hashes: Sequence[BlockHash]) -> None:
        """Marks blocks as about to be computed on the replica (see router.pending)."""
        now = self.clock()
        self.pending.expire(now)
        self.pending.mark(self.slot_of(replica_id), block_hashes, now)

    # -- lookups ---------------------------------------------------------------------------

    def match(self, block_hashes: Sequence[BlockHash], replica_ids: Iterable[str]
              ) -> dict[str, PrefixMatch]:
        """Every candidate replica's cached prefix of the prompt, in one walk.

        Returns only replicas with at least one cached block; a candidate the index has
        never heard of has none.
        """
        self.pending.expire(self.clock())
        replicas = self._replicas
        alive_dev = 0  # slots whose prefix so far is all on the device (or pending there)
        for rid in replica_ids:
            rep = replicas.get(rid)
            if rep is not None:
                alive_dev |= 1 << rep.slot
        alive_host = 0  # slots past their device run, still in their host run
        dev_get, host_get = self._masks["device"].get, self._masks["host"].get
        pend_by_bit, pend_slots = self.pending.by_bit, self.pending.slots_mask
        device_ends: list[tuple[int, int]] = []  # (slots bitmask, device run length)
        total_ends: list[tuple[int, int]] = []  # (slots bitmask, cached prefix length)
        if not alive_dev:
            return {}
        for i, h in enumerate(block_hashes):
            m = dev_get(h, 0)
            if alive_host:
                hm = host_get(h, 0)
                if (alive_dev & m) == alive_dev and (alive_host & hm) == alive_host:
                    continue  # every run, device and host, goes on
            elif (alive_dev & m) == alive_dev:
                continue  # the common step: every device run goes on, no host run open
            else:
                hm = None  # looked up below only if a device run ends here
            still = alive_dev & m
            lacking = (alive_dev ^ still) & pend_slots
            while lacking:  # runs about to end: does a pending mark carry them on?
                bit = lacking & -lacking
                if h in pend_by_bit[bit]:
                    still |= bit
                lacking ^= bit
            dropped = alive_dev ^ still
            if dropped:
                device_ends.append((dropped, i))
            in_host_run = alive_host | dropped
            if in_host_run:
                if hm is None:
                    hm = host_get(h, 0)
                staying_host = in_host_run & hm
                ended = in_host_run ^ staying_host
                if ended:
                    total_ends.append((ended, i))
                alive_host = staying_host
            alive_dev = still
            if not alive_dev and not alive_host:
                break
        else:  # walked the whole prompt: whoever is left holds all of it
            n = len(block_hashes)
            if alive_dev:
                device_ends.append((alive_dev, n))
            if alive_host or alive_dev:
                total_ends.append((alive_host | alive_dev, n))
        return self._collect(device_ends, total_ends)

    def _collect(self, device_ends: list[tuple[int, int]],
                 total_ends: list[tuple[int, int]]) -> dict[str, PrefixMatch]:
        device_len: dict[int, int] = {}
        for bits, n in device_ends:
            if n:
                for slot in _slots(bits):
                    device_len[slot] = n
        out: dict[str, PrefixMatch] = {}
        of_slot = self._replica_of_slot
        for bits, n in total_ends:
            if n:
                for slot in _slots(bits):
                    d = device_len.get(slot, 0)
                    out[of_slot[slot]] = PrefixMatch(d, n - d)
        return out

    def num_confirmed_device_blocks(self, replica_id: str,
                                    block_hashes: Sequence[BlockHash]) -> int:
        """Leading blocks events confirm on the replica's device (pending marks not counted)."""
        rep = self._replicas.get(replica_id)
        if rep is None:
            return 0
        held = rep.held["device"]
        i = 0
        for h in block_hashes:
            if h not in held:
                break
            i += 1
        return i

    def holders(self, block_hash: BlockHash, medium: Medium = "device") -> set[str]:
        """Replicas holding the block on the medium (confirmed by events)."""
        return {self._replica_of_slot[s] for s in _slots(self._masks[medium].get(block_hash, 0))}

    def blocks_of(self, replica_id: str, medium: Medium = "device") -> frozenset[BlockHash]:
        rep = self._replicas.get(replica_id)
        return frozenset(rep.held[medium]) if rep else frozenset()

    def num_blocks(self, medium: Medium = "device") -> int:
        """Distinct block hashes indexed on the medium, over all replicas."""
        return len(self._masks[medium])

    def check_invariants(self) -> None:
        assert set(self._replica_of_slot.values()) == set(self._replicas), "slot map drifted"
        assert not set(self._free_slots) & set(self._replica_of_slot), "a slot is used and free"
        for rid, rep in self._replicas.items():
            assert self._replica_of_slot[rep.slot] == rid, f"{rid} slot {rep.slot} mismapped"
        for medium in MEDIA:
            expected: dict[BlockHash, int] = {}
            for rep in self._replicas.values():
                for h in rep.held[medium]:
                    expected[h] = expected.get(h, 0) | (1 << rep.slot)
            masks = self._masks[medium]
            assert all(masks.values()), f"an empty {medium} entry"
            assert masks == expected, f"{medium} bitmasks != per-replica sets"
        self.pending.check_invariants()
        used = 0
        for slot in self._replica_of_slot:
            used |= 1 << slot
        assert self.pending.slots_mask & ~used == 0, "pending marks on a free slot"


def _slots(bits: int) -> Iterable[int]:
    while bits:
        low = bits & -bits
        yield low.bit_length() - 1
        bits ^= low
