"""Pending marks and routed work that several routers share through the index actor.

Each router marks a routed prompt's blocks pending on its replica at once (router/core/
pending.py), so the next requests with that prefix follow it before any KV event confirms
it. With several routers (ingress routers, gateways) a router learns of another's routing
only from the replica's events, one publish interval and a poll later: two requests with
the same new prefix that reach two routers in that window prefill it twice, on two
replicas. So each router also sends the marks it sets to the index actor (batched, off its
decision path), and the actor hands them to the other routers in their next poll reply,
waking their long polls; they apply them as timed marks (router/cluster/mark_sharing.py).

A mark also carries the decision's routed work (the tokens the sender's load charged its
replica, `RoutedWork`), and a `WorkEnd` follows when the request ends (a direct route's from
the actor itself, in the sender's name, as the replica reports the end; others' from the
sender): each
router's load then counts what the others routed, as one router's counts all it routed
(router/cluster/remote_work.py). A replica's published stats count it too, but a publish
interval and a poll late, and only once it is queued there.

Everything is bounded: a mark carries at most `max_mark_blocks` hashes (a prompt's first
ones: the prefix others may share), the actor keeps at most `max_kept_blocks` of them (a
message with no hash counts one) and none older than `ttl_s` (the routers' own mark TTL: an
older mark would expire on arrival), and one poll reply carries at most `max_reply_blocks`
(the rest comes with the next). A router whose next messages were dropped before it took
them, or whose cursor the actor does not have (it restarted, or the router was silent
past `router_timeout_s`), is told so (`SharedGap`): the work ends it missed cannot reach its
load, so it drops the remote routes it counts (remote_work.py).
A router that stops polling for `router_timeout_s` loses its cursor, as route ends do.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kv.hashing import BlockHash


class RoutedWork(NamedTuple):
    """What a routed request added to its replica's load, in the sender's `LoadTracker`
    terms (router/core/load.py `add`)."""

    route_id: str  # the sender's request id, which its `WorkEnd` names
    work_tokens: float
    decode_tokens: float
    recent_tokens: float


class SharedMark(NamedTuple):
    """Blocks a router just routed to a replica, before any event confirms them, and the
    work it routed there (None: not shared)."""

    replica_id: str
    block_hashes: tuple[BlockHash, ...]
    work: RoutedWork | None = None


class WorkEnd(NamedTuple):
    """A shared route ended on `replica_id`: its work leaves the load (`withdrawn`: it never
    ran, so its recent work goes too); `output_tokens`, what it produced when its end said.
    A route id can be placed twice (Serve spilled it down the ranking, or retried it): the
    replica tells which placement ended. `any_placement`: the end releases the route
    wherever it is counted (a direct route's end as its replica reported it: the routing
    router counted it on the replica it ranked first, and Serve may have sent it on)."""

    route_id: str
    replica_id: str
    withdrawn: bool = False
    output_tokens: int | None = None
    any_placement: bool = False


class SharedGap(NamedTuple):
    """Leads a poll's messages when the actor dropped some this router had not taken (past
    `ttl_s` or `max_kept_blocks`: it polled late), or does not know what it took (its first
    poll here: a new router, one silent past `router_timeout_s`, or a restarted actor): ends
    of routes it counts may be among them, so it cannot count those routes any longer
    (remote_work.py)."""

    num_dropped: int | None  # log entries dropped unseen (its own among them); None: unknown


Shared = SharedMark | WorkEnd | SharedGap


def size_of(message: Shared) -> int:
    """What a message counts against the bounds: its hashes, at least one."""
    return max(1, len(message.block_hashes)) if isinstance(message, SharedMark) else 1


@dataclass(frozen=True)
class SharedMarksConfig:
    # a mark older than this is dropped undelivered (the default pending_ttl_s; a router
    # set to a longer TTL still holds for that long the marks it received)
    ttl_s: float = 2.0
    max_mark_blocks: int = 4096  # per mark: a 64k-token prompt's prefix at block size 16
    max_kept_blocks: int = 1 << 18  # all routers' marks kept at once (4 MiB of hashes)
    max_reply_blocks: int = 1 << 15  # handed to one router per poll reply
    router_timeout_s: float = 10.0  # a router silent this long loses its cursor

    def __post_init__(self):
        for name in ("ttl_s", "router_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SharedMarksConfig: {name} must be > 0, "
                                 f"got {getattr(self, name)}")
        for name in ("max_mark_blocks", "max_kept_blocks", "max_reply_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"SharedMarksConfig: {name} must be >= 1, "
                                 f"got {getattr(self, name)}")
        if self.max_mark_blocks > self.max_kept_blocks:
            raise ValueError("SharedMarksConfig: max_mark_blocks must be <= max_kept_blocks")


class _Entry(NamedTuple):
    seq: int
    added_s: float  # monotonic
    router_id: str
    message: Shared


class SharedMarks:
    """The actor's log of shared marks and work ends, and each router's cursor into it."""

    def __init__(self, config: SharedMarksConfig | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config or SharedMarksConfig()
        self._clock = clock
        self._log: deque[_Entry] = deque()
        self._next_seq = 0  # the seq of the next entry; the log holds a contiguous run
        self._num_blocks = 0  # hashes in the log, one for each message with none
        # router id -> (seq of the first entry it has not seen, its last take (monotonic s))
        self._cursors: dict[str, tuple[int, float]] = {}

    def add(self, router_id: str, messages: Sequence[Shared]) -> bool:
        """Logs a router's marks and work ends for the others; True when any was logged
        (news for them)."""
        now = self._clock()
        cap = self.config.max_mark_blocks
        added = False
        for message in messages:
            if isinstance(message, SharedMark):
                if not (message.block_hashes or message.work):
                    continue
                message = SharedMark(str(message.replica_id),
                                     tuple(message.block_hashes[:cap]), message.work)
            elif not isinstance(message, WorkEnd):  # a gap is the actor's to tell
                continue
            self._log.append(_Entry(self._next_seq, now, router_id, message))
            self._next_seq += 1
            self._num_blocks += size_of(message)
            added = True
        self._expire(now)
        return added

    def take(self, router_id: str) -> tuple[Shared, ...]:
        """The other routers' messages this router has not seen, in the order they were
        logged: up to `max_reply_blocks` hashes (or one mark, if that alone is more), after a
        `SharedGap` when some it had not taken were dropped. A router seen for the first
        time gets those still live, after a `SharedGap(None)`."""
        now = self._clock()
        self._expire(now)
        first_seq = self._next_seq - len(self._log)
        cursor = self._cursors.get(router_id)
        start = first_seq if cursor is None else max(cursor[0], first_seq)
        gap = (() if cursor is not None and cursor[0] == start
               else (SharedGap(None if cursor is None else start - cursor[0]),))
        out: list[Shared] = []
        budget = self.config.max_reply_blocks
        seq = start
        for i in range(start - first_seq, len(self._log)):
            entry = self._log[i]
            if entry.router_id != router_id:
                n = size_of(entry.message)
                if n > budget and out:
                    break  # the rest with the next poll
                out.append(entry.message)
                budget -= n
            seq = entry.seq + 1
        self._cursors[router_id] = (seq, now)
        return gap + tuple(out)

    def forget(self, router_id: str) -> None:
        """The router left the live set (or never was in it): its next take starts after a
        `SharedGap(None)`, so it drops the work it holds from the others. While it was not
        live, the others took themselves for alone and shared nothing, their ends too."""
        self._cursors.pop(router_id, None)

    def num_blocks(self) -> int:
        return self._num_blocks

    def _expire(self, now: float) -> None:
        log, config = self._log, self.config
        cutoff = now - config.ttl_s
        while log and (log[0].added_s < cutoff or self._num_blocks > config.max_kept_blocks):
            self._num_blocks -= size_of(log.popleft().message)
        idle = now - config.router_timeout_s
        for router_id in [r for r, (_, t) in self._cursors.items() if t < idle]:
            del self._cursors[router_id]

    def check_invariants(self) -> None:
        seqs = [e.seq for e in self._log]
        assert seqs == list(range(self._next_seq - len(seqs), self._next_seq)), "log gap"
        assert self._num_blocks == sum(size_of(e.message) for e in self._log)
        assert self._num_blocks <= self.config.max_kept_blocks, "over max_kept_blocks"
        times = [e.added_s for e in self._log]
        assert times == sorted(times), "log out of time order"
