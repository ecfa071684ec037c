"""Protocol 2: KV cache events, the per-replica event log, and a consumer that converges.

A replica appends events as its cache changes; a consumer pulls `EventBatch`es. Every event
has a per-replica sequence number; a replica restart gets a new epoch. A consumer that sees a
gap or a new epoch asks for a `Snapshot` (all hashes held, per medium, valid at a sequence
number) and continues from there, so it converges after any loss, restart or reordering.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import xxhash

from kv.hashing import BlockHash

Medium = Literal["device", "host"]
MEDIA: tuple[Medium, ...] = ("device", "host")


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_hash: BlockHash | None
    medium: Medium = "device"
    # The blocks' tokens, block_size per hash, when the log records them (`EventLog.
    # with_token_ids`) and the store computed them; empty otherwise (host-tier copies and
    # copy-backs: their tokens were in the device store that came first).
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: Medium = "device"


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    """Events `first_seq .. first_seq + len(events) - 1` of one replica epoch."""

    replica_id: str
    epoch: str
    first_seq: int
    events: tuple[KVEvent, ...]

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.events)


@dataclass(frozen=True)
class Snapshot:
    """Everything a replica holds, valid after event `next_seq - 1` of `epoch`."""

    replica_id: str
    epoch: str
    next_seq: int
    device_hashes: frozenset[BlockHash]
    host_hashes: frozenset[BlockHash] = frozenset()


class EventLog:
    """A replica's event log: sequence numbers, an epoch, and a bounded buffer to drain.

    `drain()` hands out the events appended since the last drain. If more than
    `max_buffered` events pile up undrained, the oldest are dropped: the consumer then sees
    a gap and recovers with a snapshot.

    `with_token_ids`: stores computed by requests carry their tokens (`BlockStored.
    token_ids`), for publishers whose format needs them (vLLM's KV events). Off by default:
    the index actor has no use for them. Set it before the first event.
    """

    def __init__(self, replica_id: str, epoch: str | None = None, max_buffered: int = 1 << 20,
                 with_token_ids: bool = False):
        if max_buffered <= 0:
            raise ValueError(f"max_buffered must be positive, got {max_buffered}")
        self.replica_id = replica_id
        self.with_token_ids = with_token_ids
        self.epoch = epoch or uuid.uuid4().hex
        self.max_buffered = max_buffered
        self.next_seq = 0
        self._buffer: deque[KVEvent] = deque()

    def append(self, event: KVEvent) -> None:
        self._buffer.append(event)
        self.next_seq += 1
        if len(self._buffer) > self.max_buffered:
            self._buffer.popleft()

    def drain(self) -> EventBatch:
        events = tuple(self._buffer)
        self._buffer.clear()
        return EventBatch(self.replica_id, self.epoch, self.next_seq - len(events), events)

    def snapshot(self, device_hashes: Iterable[BlockHash],
                 host_hashes: Iterable[BlockHash] = ()) -> Snapshot:
        """Snapshot of the given contents, valid at the current sequence number."""
        return Snapshot(self.replica_id, self.epoch, self.next_seq,
                        frozenset(device_hashes), frozenset(host_hashes))


class ApplyResult(NamedTuple):
    applied: int  # events applied
    needs_snapshot: bool  # a gap or a new epoch: call `apply_snapshot` next


@dataclass
class _ReplicaState:
    epoch: str | None = None
    next_seq: int = 0
    synced: bool = False
    pending: dict[int, EventBatch] = field(default_factory=dict)  # first_seq -> early batch


class ReplicaEventTracker:
    """Applies one replica's batches in order; detects gaps, reordering and restarts.

    Batches that arrive early (reordered) are held and applied once the gap before them
    fills; a gap or a new epoch also asks for a snapshot, which resolves it either way.
    `on_event(medium, op, hashes)` receives the effect of each event: op is "add" or
    "remove"; `on_clear(medium | None)` clears one medium or all.
    """

    def __init__(
        self,
        on_event: Callable[[Medium, str, tuple[BlockHash, ...]], None],
        on_clear: Callable[[Medium | None], None],
        max_held_batches: int = 64,
    ):
        self._on_event = on_event
        self._on_clear = on_clear
        self._max_held = max_held_batches
        self._state = _ReplicaState()

    @property
    def synced(self) -> bool:
        return self._state.synced

    @property
    def next_seq(self) -> int:
        return self._state.next_seq

    def apply_batch(self, batch: EventBatch) -> ApplyResult:
        st = self._state
        if batch.epoch != st.epoch or not st.synced:
            return ApplyResult(0, True)
        if batch.next_seq <= st.next_seq:
            return ApplyResult(0, False)  # an old duplicate
        if batch.first_seq > st.next_seq:  # a gap: hold the batch, it may be reordered
            st.pending[batch.first_seq] = batch
            if len(st.pending) > self._max_held:
                st.pending.clear()
                st.synced = False
            return ApplyResult(0, True)
        applied = self._apply_events(batch, skip=st.next_seq - batch.first_seq)
        while st.pending:  # drain held batches that now connect
            later = [b for s, b in st.pending.items() if s <= st.next_seq]
            if not later:
                break
            for b in later:
                del st.pending[b.first_seq]
                if b.next_seq > st.next_seq:
                    applied += self._apply_events(b, skip=st.next_seq - b.first_seq)
        return ApplyResult(applied, False)

    def apply_snapshot(self, snap: Snapshot) -> None:
        st = self._state
        self._on_clear(None)
        self._on_event("device", "add", tuple(snap.device_hashes))
        self._on_event("host", "add", tuple(snap.host_hashes))
        held = [b for b in st.pending.values() if b.epoch == snap.epoch]
        self._state = _ReplicaState(snap.epoch, snap.next_seq, True)
        for b in sorted(held, key=lambda b: b.first_seq):
            self.apply_batch(b)

    def _apply_events(self, batch: EventBatch, skip: int) -> int:
        for ev in batch.events[skip:]:
            if isinstance(ev, BlockStored):
                self._on_event(ev.medium, "add", ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                self._on_event(ev.medium, "remove", ev.block_hashes)
            else:
                self._on_clear(None)
        self._state.next_seq = batch.next_seq
        return len(batch.events) - skip


class SetIndex:
    """The simplest consumer: per replica and medium, the set of hashes it holds."""

    def __init__(self) -> None:
        self.contents: dict[str, dict[Medium, set[BlockHash]]] = {}
        self._trackers: dict[str, ReplicaEventTracker] = {}

    def tracker(self, replica_id: str) -> ReplicaEventTracker:
        if replica_id not in self._trackers:
            sets: dict[Medium, set[BlockHash]] = {m: set() for m in MEDIA}
            self.contents[replica_id] = sets

            def on_event(medium: Medium, op: str, hashes: tuple[BlockHash, ...]) -> None:
                (sets[medium].update if op == "add" else sets[medium].difference_update)(hashes)

            def on_clear(medium: Medium | None) -> None:
                for m in MEDIA if medium is None else (medium,):
                    sets[m].clear()

            self._trackers[replica_id] = ReplicaEventTracker(on_event, on_clear)
        return self._trackers[replica_id]

    def forget(self, replica_id: str) -> None:
        self._trackers.pop(replica_id, None)
        self.contents.pop(replica_id, None)


@dataclass(frozen=True)
class Cursor:
    """How far a consumer has applied one replica's events."""

    epoch: str
    next_seq: int


@dataclass(frozen=True)
class ContentsDigest:
    """A compact fingerprint of one replica's contents (to compare views cheaply)."""

    num_device_blocks: int
    num_host_blocks: int
    digest: str


def contents_digest(device_hashes: set[BlockHash] | frozenset[BlockHash],
                    host_hashes: set[BlockHash] | frozenset[BlockHash]) -> ContentsDigest:
    h = xxhash.xxh3_64()
    for medium_hashes in (device_hashes, host_hashes):
        h.update(b"|")
        for block_hash in sorted(medium_hashes):
            h.update(block_hash)
    return ContentsDigest(len(device_hashes), len(host_hashes), h.hexdigest())
