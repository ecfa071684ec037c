"""The KV index actor's view of one replica: contents, a log of recent events, a cursor API.

Batches from a replica may arrive lost, duplicated or reordered; `kv.events`' tracker (the
one Protocol 2 consumer) applies them in sequence order, holds early ones and asks for a
snapshot after a gap or a new epoch. On top of it, `ReplicaLog` keeps the last
`max_logged_events` applied events (and at most `max_logged_blocks` blocks in them: one
event may carry thousands) so that a router whose cursor is recent gets a delta; any other
router gets a snapshot of the contents held here (no call to the replica).

    seq:   log_start_seq ........................ next_seq
    log:   [ batch | batch | ... | batch ]        (contiguous, applied)
    held:                                           [ batch ]  [ batch ]  (early, not applied)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from kv.events import (
    AllBlocksCleared,
    ContentsDigest,
    Cursor,
    EventBatch,
    ReplicaSets,
    Snapshot,
    contents_digest,
)
from router.cluster.packed_batches import PackedBatches, pack_one


class _Logged:
    """A logged batch, and its columns once a packed poll (or a packed publish) made them."""

    __slots__ = ("batch", "packed")

    def __init__(self, batch: EventBatch, packed: PackedBatches | None):
        self.batch = batch
        self.packed = packed

    def columns(self) -> PackedBatches:
        if self.packed is None:
            self.packed = pack_one(self.batch)
        return self.packed


class ReplicaLog:
    """One replica's contents and recent events, as received by the index actor."""

    def __init__(self, replica_id: str, max_logged_events: int = 8192,
                 max_held_batches: int = 64, max_logged_blocks: int = 1 << 18):
        if max_logged_events < 1:
            raise ValueError(f"max_logged_events must be >= 1, got {max_logged_events}")
        if max_logged_blocks < 1:
            raise ValueError(f"max_logged_blocks must be >= 1, got {max_logged_blocks}")
        self.replica_id = replica_id
        self._sets = ReplicaSets(max_held_batches)
        self._tracker = self._sets.tracker
        self.contents = self._sets.contents
        self._log: deque[_Logged] = deque()
        self._num_logged_events = 0
        self._max_logged_events = max_logged_events
        self._num_logged_blocks = 0
        self._max_logged_blocks = max_logged_blocks

    @property
    def synced(self) -> bool:
        return self._tracker.synced

    @property
    def epoch(self) -> str | None:
        return self._tracker.epoch

    @property
    def next_seq(self) -> int:
        return self._tracker.next_seq

    @property
    def log_start_seq(self) -> int:
        return self._log[0].batch.first_seq if self._log else self.next_seq

    def publish(self, batch: EventBatch, packed: PackedBatches | None = None) -> bool:
        """Applies what connects; returns True when a snapshot is needed to go on.
        `packed`: the batch's columns when it came packed (kept for packed polls)."""
        result = self._tracker.apply_batch(batch)
        untrimmed = bool(result.batches) and result.batches[0] is batch
        self._append(result.batches, packed if untrimmed else None)
        return result.needs_snapshot

    def apply_snapshot(self, snap: Snapshot) -> None:
        result = self._tracker.apply_snapshot(snap)
        if result is None:
            return  # older than what we have applied
        self._log.clear()  # the log restarts at the snapshot
        self._num_logged_events = self._num_logged_blocks = 0
        self._append(result.batches)

    def snapshot(self) -> Snapshot | None:
        epoch = self.epoch
        if not self.synced or epoch is None:
            return None
        return Snapshot(self.replica_id, epoch, self.next_seq,
                        frozenset(self.contents["device"]), frozenset(self.contents["host"]))

    def delta_since(self, cursor: Cursor | None) -> list[EventBatch] | None:
        """Batches that take `cursor` to `next_seq`; None when only a snapshot can."""
        logged = self._logged_since(cursor)
        if logged is None:
            return None
        return [_trimmed(entry.batch, cursor.next_seq) for entry in logged]

    def packed_delta_since(self, cursor: Cursor | None) -> list[PackedBatches] | None:
        """`delta_since` as each batch's columns (packed once, whoever asks next)."""
        logged = self._logged_since(cursor)
        if logged is None:
            return None
        return [entry.columns() if entry.batch.first_seq >= cursor.next_seq
                else pack_one(_trimmed(entry.batch, cursor.next_seq)) for entry in logged]

    def _logged_since(self, cursor: Cursor | None) -> list[_Logged] | None:
        if not self.synced or cursor is None or cursor.epoch != self.epoch:
            return None
        if cursor.next_seq > self.next_seq or cursor.next_seq < self.log_start_seq:
            return None
        # From the newest batch back: a router that keeps up needs the last one or two, and
        # a scan from the log's start cost every poll O(log) per replica (8,192 events).
        out: list[_Logged] = []
        for entry in reversed(self._log):
            if entry.batch.next_seq <= cursor.next_seq:
                break
            out.append(entry)
        out.reverse()
        return out

    def digest(self) -> ContentsDigest:
        return contents_digest(self.contents["device"], self.contents["host"])

    def check_invariants(self) -> None:
        self._tracker.check_invariants()
        seq = self.log_start_seq
        for entry in self._log:
            batch = entry.batch
            assert batch.first_seq == seq, "log is not contiguous"
            assert batch.epoch == self.epoch
            assert entry.packed is None or (entry.packed.first_seqs, entry.packed.num_events) == (
                (batch.first_seq,), (len(batch.events),)), "columns of another batch"
            seq = batch.next_seq
        assert seq == self.next_seq, "log does not end at next_seq"
        assert self._num_logged_events == sum(len(e.batch.events) for e in self._log)
        assert self._num_logged_blocks == sum(_num_blocks(e.batch) for e in self._log)

    def _append(self, batches: Iterable[EventBatch], packed_first: PackedBatches | None = None
                ) -> None:
        for batch in batches:
            if batch.events:
                self._log.append(_Logged(batch, packed_first))
                self._num_logged_events += len(batch.events)
                self._num_logged_blocks += _num_blocks(batch)
            packed_first = None
        while (self._num_logged_events > self._max_logged_events
               or self._num_logged_blocks > self._max_logged_blocks):
            oldest = self._log.popleft().batch
            self._num_logged_events -= len(oldest.events)
            self._num_logged_blocks -= _num_blocks(oldest)


def _num_blocks(batch: EventBatch) -> int:
    return sum(0 if isinstance(e, AllBlocksCleared) else len(e.block_hashes)
               for e in batch.events)


def _trimmed(batch: EventBatch, next_seq: int) -> EventBatch:
    """The batch from event `next_seq` on."""
    skip = max(0, next_seq - batch.first_seq)
    return batch if skip == 0 else EventBatch(batch.replica_id, batch.epoch,
                                              batch.first_seq + skip, batch.events[skip:])

