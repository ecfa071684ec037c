"""The KV index actor's view of one replica: contents, an in-order event log, a cursor API.

Batches from a replica may arrive lost, duplicated or reordered. `ReplicaLog` applies them in
sequence order (holding early ones), asks for a snapshot after a gap or a new epoch, and
keeps the last `max_logged_events` applied events so that a router whose cursor is recent
gets a delta; any other router gets a snapshot of the contents held here (no call to the
replica).

    seq:   log_start_seq ........................ next_seq
    log:   [ batch | batch | ... | batch ]        (contiguous, applied)
    held:                                           [ batch ]  [ batch ]  (early, not applied)
"""

from __future__ import annotations

from collections import deque

from kv.events import (
    MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ContentsDigest,
    Cursor,
    EventBatch,
    Medium,
    Snapshot,
    contents_digest,
)
from kv.hashing import BlockHash


class ReplicaLog:
    """One replica's contents and recent events, as received by the index actor."""

    def __init__(self, replica_id: str, max_logged_events: int = 8192,
                 max_held_batches: int = 64):
        if max_logged_events < 1 or max_held_batches < 1:
            raise ValueError("max_logged_events and max_held_batches must be >= 1")
        self.replica_id = replica_id
        self.epoch: str | None = None
        self.next_seq = 0
        self.synced = False
        self.contents: dict[Medium, set[BlockHash]] = {m: set() for m in MEDIA}
        self._log: deque[EventBatch] = deque()
        self._num_logged_events = 0
        self._held: dict[int, EventBatch] = {}
        self._max_logged_events = max_logged_events
        self._max_held_batches = max_held_batches

    @property
    def log_start_seq(self) -> int:
        return self._log[0].first_seq if self._log else self.next_seq

    def publish(self, batch: EventBatch) -> bool:
        """Applies what connects; returns True when a snapshot is needed to go on."""
        if not self.synced or batch.epoch != self.epoch:
            return True
        if batch.next_seq <= self.next_seq:
            return False  # an old duplicate
        if batch.first_seq > self.next_seq:  # a gap: hold it, it may be reordered
            self._held[batch.first_seq] = batch
            if len(self._held) > self._max_held_batches:
                self._held.clear()
                self.synced = False
            return True
        self._apply(batch)
        while True:  # held batches that now connect
            ready = [s for s in self._held if s <= self.next_seq]
            if not ready:
                break
            for first_seq in sorted(ready):
                held = self._held.pop(first_seq)
                if held.next_seq > self.next_seq:
                    self._apply(held)
        return bool(self._held)

    def apply_snapshot(self, snap: Snapshot) -> None:
        if self.synced and snap.epoch == self.epoch and snap.next_seq < self.next_seq:
            return  # older than what we have applied
        self.contents = {"device": set(snap.device_hashes), "host": set(snap.host_hashes)}
        self.epoch = snap.epoch
        self.next_seq = snap.next_seq
        self.synced = True
        self._log.clear()
        self._num_logged_events = 0
        held = [b for b in self._held.values() if b.epoch == snap.epoch]
        self._held.clear()
        for batch in sorted(held, key=lambda b: b.first_seq):
            self.publish(batch)

    def snapshot(self) -> Snapshot | None:
        if not self.synced or self.epoch is None:
            return None
        return Snapshot(self.replica_id, self.epoch, self.next_seq,
                        frozenset(self.contents["device"]), frozenset(self.contents["host"]))

    def delta_since(self, cursor: Cursor | None) -> list[EventBatch] | None:
        """Batches that take `cursor` to `next_seq`; None when only a snapshot can."""
        if not self.synced or cursor is None or cursor.epoch != self.epoch:
            return None
        if cursor.next_seq > self.next_seq or cursor.next_seq < self.log_start_seq:
            return None
        out: list[EventBatch] = []
        for batch in self._log:
            if batch.next_seq <= cursor.next_seq:
                continue
            skip = max(0, cursor.next_seq - batch.first_seq)
            out.append(batch if skip == 0 else EventBatch(
                batch.replica_id, batch.epoch, batch.first_seq + skip, batch.events[skip:]))
        return out

    def digest(self) -> ContentsDigest:
        return contents_digest(self.contents["device"], self.contents["host"])

    def check_invariants(self) -> None:
        seq = self.log_start_seq
        for batch in self._log:
            assert batch.first_seq == seq, "log is not contiguous"
            assert batch.epoch == self.epoch
            seq = batch.next_seq
        assert seq == self.next_seq, "log does not end at next_seq"
        assert self._num_logged_events == sum(len(b.events) for b in self._log)
        assert all(s > self.next_seq for s in self._held), "a connecting batch is held"

    def _apply(self, batch: EventBatch) -> None:
        skip = self.next_seq - batch.first_seq
        if skip:
            batch = EventBatch(batch.replica_id, batch.epoch, self.next_seq,
                               batch.events[skip:])
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self.contents[ev.medium].update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                self.contents[ev.medium].difference_update(ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared):
                for hashes in self.contents.values():
                    hashes.clear()
        self.next_seq = batch.next_seq
        if batch.events:
            self._log.append(batch)
            self._num_logged_events += len(batch.events)
        while self._num_logged_events > self._max_logged_events:
            self._num_logged_events -= len(self._log.popleft().events)
