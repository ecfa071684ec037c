"""The messages of a router's long poll to the KV index actor, and how they pickle.

A router sends its cursor per replica (`PollRequest`); the actor answers with what changed
since (`PollReply`): deltas or snapshots, removed replicas, every replica's load stats, and
what other routers shared. Both pickle their per-replica parts as columns of plain tuples,
not an object a replica: a poll runs many times a second at hundreds of replicas.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from kv.events import ContentsDigest, Cursor, EventBatch, Snapshot
from protocol.engine import EngineStats
from router.cluster.packed_batches import PackedBatches
from router.cluster.shared_marks import Shared
from router.core.candidates import RouterRank


@dataclass(frozen=True)
class PollRequest:
    router_id: str
    cursors: Mapping[str, Cursor]  # replica_id -> what this router has applied
    wait_s: float = 0.0  # long poll: wait up to this long for news
    view: dict[str, ContentsDigest] = field(default_factory=dict)  # the router's index
    # the reply's batches as columns (`PollReply.packed`), not EventBatch objects
    packed: bool = False

    def __reduce__(self):
        # The cursors travel as columns: a Cursor object each cost 1.7 us to pickle and
        # unpickle, 1.4 ms a poll at 800 replicas (tuples of str and int take a fifth).
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        cursors = fields.pop("cursors")
        return (_poll_request, (fields, tuple(cursors), tuple(c.epoch for c in cursors.values()),
                                tuple(c.next_seq for c in cursors.values())))


def _poll_request(fields: dict, replica_ids: tuple[str, ...], epochs: tuple[str, ...],
                  next_seqs: tuple[int, ...]) -> PollRequest:
    return PollRequest(cursors=CursorColumns(dict(zip(replica_ids, zip(epochs, next_seqs)))),
                       **fields)


class CursorColumns(Mapping[str, Cursor]):
    """A request's cursors as they arrived, (epoch, next_seq) tuples, a `Cursor` made only
    when one is read: the actor compares the tuples, and a Cursor object each cost 1.2 ms
    a poll at 800 replicas, most of the request's unpickling."""

    __slots__ = ("positions",)

    def __init__(self, positions: dict[str, tuple[str, int]]):
        self.positions = positions

    def __getitem__(self, replica_id: str) -> Cursor:
        return Cursor(*self.positions[replica_id])

    def __iter__(self) -> Iterator[str]:
        return iter(self.positions)

    def __len__(self) -> int:
        return len(self.positions)


def positions_of(cursors: Mapping[str, Cursor]) -> dict[str, tuple[str, int]]:
    """replica_id -> (epoch, next_seq) of each cursor."""
    if isinstance(cursors, CursorColumns):
        return cursors.positions
    return {rid: (c.epoch, c.next_seq) for rid, c in cursors.items()}


@dataclass(frozen=True)
class PollReply:
    snapshots: tuple[Snapshot, ...]
    batches: tuple[EventBatch, ...]
    stats: dict[str, EngineStats]  # replica_id -> latest stats
    removed_replica_ids: tuple[str, ...]  # in the request's cursors, not live any more
    # external workers' KV event mode, "events" | "approximate" (approximate: route the
    # worker from this router's own history; its index is a subset or stale)
    worker_modes: dict[str, str] = field(default_factory=dict)
    # direct-streaming requests this router routed that ended on their replica
    ended_route_ids: tuple[str, ...] = ()
    # the actor's incarnation: a new one means it restarted and forgot every replica, so
    # routers hold their state for a grace period instead of dropping it (index_mirror.py)
    incarnation: str = ""
    # the pending marks (with their routed work) other routers set, and the ends of that
    # work, since this router's last poll, in their order (shared_marks.py)
    shared_marks: tuple[Shared, ...] = ()
    # with `PollRequest.packed`: the batches, as columns (router/cluster/packed_batches.py)
    packed: PackedBatches | None = None
    # this router's rank among the routers polling the actor, sorted by id: where it lists
    # the replicas from (router/core/candidates.py)
    router_rank: RouterRank | None = None

    # `stats` as each replica's field values, in its order (the actor keeps them made)
    stats_values: tuple[tuple, ...] | None = field(default=None, repr=False, compare=False)

    def __reduce__(self):
        # Every replica's stats go with every poll: as EngineStats objects they were most
        # of a packed reply's pickling; as one tuple of values a replica, a fifth of it.
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        stats, values = fields.pop("stats"), fields.pop("stats_values")
        return (_poll_reply, (fields, tuple(stats), values if values is not None else tuple(
            map(values_of, stats.values()))))


_STATS_FIELDS = tuple(f.name for f in dataclasses.fields(EngineStats))


def values_of(stats: EngineStats) -> tuple:
    return tuple(getattr(stats, name) for name in _STATS_FIELDS)


def _poll_reply(fields: dict, replica_ids: tuple[str, ...], stats: tuple[tuple, ...]
                ) -> PollReply:
    return PollReply(stats=dict(zip(replica_ids, (EngineStats(*v) for v in stats))), **fields)
