"""The ledger: one record for each routed request, from its decision to its release.

A request is recorded when it is routed and leaves the ledger when it is released, one of
two ways: ended (it ran, or may have: its load goes, its pending marks start their TTL) or
withdrawn (it never ran where it was recorded: everything it charged goes at once).
Between the two its record says where it is and how far it got:

    routed --move--> moved          Serve sent it down the ranking (the first was full)
    routed/moved --dispatch--> dispatched   a Serve call, handed to its replica
    routed/moved --claim--> claimed         a direct route, reported arrived at its replica

How a request's end reaches the router depends on its kind (`RouteKind`), and so do the
timeouts that release a record whose end never comes (`expire`, policy in `LedgerConfig`).
The ledger only keeps the records; `router.core.router.Router` owns it and applies each
release to the load and the pending marks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from kv.hashing import BlockHash

__all__ = ["Expired", "Ledger", "LedgerConfig", "Release", "RouteKind", "RouteRecord",
           "RouteState"]


class RouteKind(Enum):
    """How the request's end comes back to the router that routed it."""

    CALL = "call"  # a Serve call: Serve's completion callback ends it once dispatched
    DIRECT = "direct"  # sent straight to the replica's HTTP port: the replica reports its
    # arrival (claim) and end through the index actor
    PROXIED = "proxied"  # its caller proxies it and releases it itself (a gateway over
    # external workers, the simulator, a benchmark): never expired


class RouteState(Enum):
    ROUTED = "routed"  # recorded on the policy's first choice
    MOVED = "moved"  # recorded on another candidate (the first one was full)
    DISPATCHED = "dispatched"  # a Serve call its replica took: its completion will come
    CLAIMED = "claimed"  # a direct route its replica reported arrived


class Release(Enum):
    END = "end"  # it ran, or may have: load goes, pending marks start their TTL
    WITHDRAW = "withdraw"  # it never ran there: load, recent work and marks go at once


class RouteRecord(NamedTuple):
    """A routed request as the ledger holds it (every caller's query type)."""

    replica_id: str
    kind: RouteKind
    state: RouteState
    routed_at_s: float  # the router's clock at the decision
    block_hashes: Sequence[BlockHash]
    held: Sequence[BlockHash]  # the blocks it holds pending on replica_id ([] on history)
    num_prompt_tokens: int
    max_tokens: int
    predicted_hit_tokens: tuple[int, int] = (0, 0)  # device, host
    decision_s: float = 0.0  # what ranking and recording it took (perf counter seconds)
    num_sequences: int = 1  # the completions max_tokens is over (n x a batch's prompts)


class Expired(NamedTuple):
    request_id: str
    replica_id: str
    release: Release


@dataclass(frozen=True)
class LedgerConfig:
    """When a record whose end never came is released.

    Args:
        abandoned_after_s: a Serve call never dispatched (its caller gave up while Serve
            was routing gets no completion callback): ended this long after its decision.
        claim_window_s: a direct route no replica claimed this long after its decision
            never reached one (HAProxy's client left before it was sent, HAProxy sent it
            elsewhere, or nobody sent it): withdrawn. A replica claims a route with its
            next publish (50 ms), so this is many times the usual delay.
        idle_grace_s: a direct route this old on a replica whose latest stats show nothing
            running or waiting has ended and its end was lost: ended.
        lost_after_s: a direct route whose end never came back (longer than any request
            runs here): ended.
        sweep_at_records: records a long timeout could release, kept before looking for
            them between the periodic sweeps (every abandoned_after_s / 2).
    """

    abandoned_after_s: float = 60.0
    claim_window_s: float = 5.0
    idle_grace_s: float = 5.0
    lost_after_s: float = 600.0
    sweep_at_records: int = 1024

    def __post_init__(self):
        for name in ("abandoned_after_s", "claim_window_s", "idle_grace_s", "lost_after_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"LedgerConfig: {name} must be a finite number > 0, "
                                 f"got {value!r}")
        if isinstance(self.sweep_at_records, bool) or not (
                isinstance(self.sweep_at_records, int) and self.sweep_at_records >= 1):
            raise ValueError(f"LedgerConfig: sweep_at_records must be an int >= 1, got "
                             f"{self.sweep_at_records!r}")


_UNDISPATCHED = (RouteState.ROUTED, RouteState.MOVED)


def _sweepable(record: RouteRecord) -> bool:
    """A long timeout may release it (see `LedgerConfig`)."""
    return record.kind is RouteKind.DIRECT or (
        record.kind is RouteKind.CALL and record.state in _UNDISPATCHED)


class Ledger:
    """Request id -> its `RouteRecord`, until it is released."""

    def __init__(self, config: LedgerConfig | None = None):
        self.config = LedgerConfig() if config is None else config
        self._records: dict[str, RouteRecord] = {}
        self._num_sweepable = 0
        self._next_sweep_s: float | None = None  # set by the first expire

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._records

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def get(self, request_id: str) -> RouteRecord | None:
        return self._records.get(request_id)

    def on_replica(self, replica_id: str) -> list[str]:
        """The requests recorded on the replica."""
        return [r for r, rec in self._records.items() if rec.replica_id == replica_id]

    def put(self, request_id: str, record: RouteRecord) -> None:
        """Records the request, or replaces its record (a move, marks it holds now)."""
        records = self._records
        old = records.get(request_id)
        if old is not None and old.kind is not RouteKind.PROXIED and _sweepable(old):
            self._num_sweepable -= 1
        if record.kind is not RouteKind.PROXIED and _sweepable(record):
            self._num_sweepable += 1
        records[request_id] = record

    def dispatch(self, request_id: str) -> RouteRecord | None:
        """A Serve call its replica took (its completion callback will end it); None when
        the request is not an undispatched call."""
        record = self._records.get(request_id)
        if record is None or record.kind is not RouteKind.CALL or record.state not in (
                _UNDISPATCHED):
            return None
        record = record._replace(state=RouteState.DISPATCHED)
        self.put(request_id, record)
        return record

    def claim(self, request_id: str) -> bool:
        """A direct route reported arrived at its replica; False when it is not an unclaimed
        direct route (released already, or claimed twice)."""
        record = self._records.get(request_id)
        if record is None or record.kind is not RouteKind.DIRECT or record.state not in (
                _UNDISPATCHED):
            return False
        self.put(request_id, record._replace(state=RouteState.CLAIMED))
        return True

    def pop(self, request_id: str) -> RouteRecord | None:
        record = self._records.pop(request_id, None)
        if record is not None and record.kind is not RouteKind.PROXIED and _sweepable(record):
            self._num_sweepable -= 1
        return record

    def expire(self, now_s: float, idle_replica_ids: frozenset[str] | None = None
               ) -> list[Expired]:
        """The records whose end will not come, and how to release each (they stay recorded
        until released).

        `idle_replica_ids`: the replicas whose latest stats show nothing running or
        waiting, from a report of the replicas that just came back (claims come the same
        way); None without one: then only the long timeouts apply, and only when a sweep is
        due (every `abandoned_after_s / 2`, or past `sweep_at_records`), so a decision
        can call this at no cost.
        """
        config = self.config
        if self._next_sweep_s is None:
            self._next_sweep_s = now_s + config.abandoned_after_s
        sweep = (now_s >= self._next_sweep_s
                 or self._num_sweepable > config.sweep_at_records)
        if idle_replica_ids is None and not sweep:
            return []
        if sweep:
            self._next_sweep_s = now_s + config.abandoned_after_s / 2
        out: list[Expired] = []
        for request_id, record in self._records.items():
            release = self._due(record, now_s, idle_replica_ids, sweep)
            if release is not None:
                out.append(Expired(request_id, record.replica_id, release))
        return out

    def _due(self, record: RouteRecord, now_s: float, idle_replica_ids: frozenset[str] | None,
             sweep: bool) -> Release | None:
        config = self.config
        age_s = now_s - record.routed_at_s
        if record.kind is RouteKind.DIRECT:
            if idle_replica_ids is not None:
                if record.state is not RouteState.CLAIMED and age_s > config.claim_window_s:
                    return Release.WITHDRAW
                if age_s > config.idle_grace_s and record.replica_id in idle_replica_ids:
                    return Release.END
            if sweep and age_s > config.lost_after_s:
                return Release.END
        elif record.kind is RouteKind.CALL:
            if sweep and record.state in _UNDISPATCHED and age_s > config.abandoned_after_s:
                return Release.END
        return None

    def check_invariants(self) -> None:
        assert self._num_sweepable == sum(map(_sweepable, self._records.values())), (
            f"{self._num_sweepable} sweepable records counted")
        for request_id, record in self._records.items():
            assert (record.state is not RouteState.DISPATCHED
                    or record.kind is RouteKind.CALL), f"{request_id}: dispatched {record.kind}"
            assert (record.state is not RouteState.CLAIMED
                    or record.kind is RouteKind.DIRECT), f"{request_id}: claimed {record.kind}"
