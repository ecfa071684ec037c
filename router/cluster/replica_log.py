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
        self._log: deque[EventBatch] = deque()
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
        return self._log[0].first_seq if self._log else self.next_seq

    def publish(self, batch: EventBatch) -> bool:
        """Applies what connects; returns True when a snapshot is needed to go on."""
        result = self._tracker.apply_batch(batch)
        self._append(result.batches)
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
        if not self.synced or cursor is None or cursor.epoch != self.epoch:
            return None
        if cursor.next_seq > self.next_seq or cursor.next_seq < self.log_start_seq:
            return None
        # From the newest batch back: a router that keeps up needs the last one or two, and
        # a scan from the log's start cost every poll O(log) per replica (8,192 events).
        out: list[EventBatch] = []
        for batch in reversed(self._log):
            if batch.next_seq <= cursor.next_seq:
                break
            skip = max(0, cursor.next_seq - batch.first_seq)
            out.append(batch if skip == 0 else EventBatch(
                batch.replica_id, batch.epoch, batch.first_seq + skip, batch.events[skip:]))
        out.reverse()
        return out

    def digest(self) -> ContentsDigest:
        return contents_digest(self.contents["device"], self.contents["host"])

    def check_invariants(self) -> None:
        self._tracker.check_invariants()
        seq = self.log_start_seq
        for batch in self._log:
            assert batch.first_seq == seq, "log is not contiguous"
            assert batch.epoch == self.epoch
            seq = batch.next_seq
        assert seq == self.next_seq, "log does not end at next_seq"
        assert self._num_logged_events == sum(len(b.events) for b in self._log)
        assert self._num_logged_blocks == sum(_num_blocks(b) for b in self._log)

    def _append(self, batches: Iterable[EventBatch]) -> None:
        for batch in batches:
            if batch.events:
                self._log.append(batch)
                self._num_logged_events += len(batch.events)
                self._num_logged_blocks += _num_blocks(batch)
        while (self._num_logged_events > self._max_logged_events
               or self._num_logged_blocks > self._max_logged_blocks):
            oldest = self._log.popleft()
            self._num_logged_events -= len(oldest.events)
            self._num_logged_blocks -= _num_blocks(oldest)


def _num_blocks(batch: EventBatch) -> int:
    return sum(0 if isinstance(e, AllBlocksCleared) else len(e.block_hashes)
               for e in batch.events)
