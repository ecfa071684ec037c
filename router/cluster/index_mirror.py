"""Keeps a `router.core.router.Router`'s index mirror fresh from the KV index actor.

One long-poll loop per router process: it sends its cursor per replica and applies what
comes back (deltas, snapshots, removed replicas, load stats). When the actor cannot be
reached, or nothing has come back for `stale_after_s`, the router decides in approximate
mode (`Router.set_fallback(True)`) until the next good poll. It also carries the pending
marks and routed work this router shares to the other routers, and theirs to this one
(mark_sharing.py, remote_work.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kv.events import ContentsDigest, Cursor, EventBatch, contents_digest
from kv.hashing import BlockHash
from router.cluster.actor_link import ActorLink
from router.cluster.index_actor import PollReply, PollRequest, find_index
from router.cluster.mark_sharing import MarkSender, MarkSharingConfig, apply_shared_marks
from router.cluster.remote_work import RemoteWork
from router.cluster.shared_marks import RoutedWork, SharedMark
from router.core.candidates import RouterRank
from router.core.router import Router

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MirrorConfig:
    poll_wait_s: float = 1.0  # long-poll: the actor answers at once on news, else after this
    # Between a reply and the next poll. Under a steady stream of events every long poll
    # returns at once, and a poll costs the actor O(replicas) (1.4 ms at 800): unpaced, 8
    # routers' polls took the actor's core from the publishes. This caps a router at 20
    # polls a second and adds at most 50 ms to an event's way.
    poll_interval_s: float = 0.05
    # The pause scales with the fleet up to this many replicas (poll_interval_s from here
    # on): a poll costs the actor O(replicas), so with a few it is cheap, and a pause only
    # delays what the other routers shared (pending marks: live on 2 replicas and 2
    # routers, a 50 ms pause let the next request of a prefix beat its mark to the other
    # router for 45 groups of 200, against 1 unpaced).
    pace_full_replicas: int = 64
    poll_timeout_s: float = 5.0  # a poll not answered by then counts as unreachable
    stale_after_s: float = 5.0  # no good poll for this long: approximate mode
    retry_interval_s: float = 0.25  # after a failed poll
    # The view (digests of the index, for convergence checks) is sorted and hashed anew at
    # most this often: under load every poll brings events, and redoing it per poll cost
    # the router process more CPU than its routing decisions did.
    view_refresh_s: float = 1.0
    # A replica this router saw die is ignored (at its epoch) for this long: polls that
    # crossed its death still carry it and must not bring it back.
    gone_ttl_s: float = 300.0
    # After an index-actor restart (it forgot every replica), replicas it no longer lists
    # keep their index, load, marks and history this long, until they publish again.
    restart_grace_s: float = 15.0
    # send this router's pending marks to the other routers, and apply theirs
    share_marks: bool = True
    # the same for routed work: each router's load counts what the others routed
    share_work: bool = True

    def __post_init__(self):
        for name in ("poll_timeout_s", "stale_after_s", "retry_interval_s", "view_refresh_s",
                     "gone_ttl_s", "restart_grace_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"MirrorConfig: {name} must be > 0, got {getattr(self, name)}")
        if self.pace_full_replicas < 1:
            raise ValueError(f"MirrorConfig: pace_full_replicas must be >= 1, got "
                             f"{self.pace_full_replicas}")
        if not self.poll_interval_s >= 0:
            raise ValueError(f"MirrorConfig: poll_interval_s must be >= 0, got "
                             f"{self.poll_interval_s}")
        if not 0 <= self.poll_wait_s < self.poll_timeout_s:
            raise ValueError("MirrorConfig: poll_wait_s must be in [0, poll_timeout_s)")


class IndexMirror:
    """Feeds `router` from the index actor. `lock` guards the router (shared with the
    routing path, which may run on another thread). `on_removed(replica_id)` handles a
    replica the actor stopped listing: by default `Router.remove_replica` (the replica is
    gone); external workers, whose events may stop while they still serve, drop only
    their index (`Router.drop_index`)."""

    def __init__(self, router: Router, router_id: str, lock: threading.Lock, *,
                 config: MirrorConfig | None = None, index: Any = None,
                 on_removed: Callable[[str], None] | None = None,
                 on_routes_ended: Callable[[tuple[str, ...]], None] | None = None,
                 on_poll: Callable[[PollReply], None] | None = None):
        self.router = router
        self._remove = on_removed or router.remove_replica
        self._on_routes_ended = on_routes_ended  # direct routes that ended on a replica
        self._on_poll = on_poll  # every reply, once applied
        self.router_id = router_id
        self.config = config or MirrorConfig()
        self._lock = lock
        self._index = ActorLink(f"router {router_id}: index poll", find_index, index,
                                on_failure=lambda _: self._set_fallback("index_unreachable"))
        self._cursors: dict[str, Cursor] = {}
        # replica_id -> (epoch it died in, None: any; when) for replicas seen dead here
        self._gone: dict[str, tuple[str | None, float]] = {}
        # where each gone replica the actor still lists is in its log: polls carry it, so
        # the actor answers with deltas (skipped here) and waits for news, not with its
        # snapshot at once, poll after poll, in a loop that never waits
        self._skipped: dict[str, Cursor] = {}
        self._incarnation: str | None = None  # of the index actor, as of the last poll
        self._grace: dict[str, float] = {}  # replica_id -> monotonic deadline (restart)
        self._view: dict[str, ContentsDigest] = {}
        self._view_dirty = True
        self._view_at_s = -math.inf  # when the view was last computed (monotonic s)
        self._last_ok_s: float | None = None
        self.fallback_reason: str | None = "index_unreachable"  # until the first good poll
        self.num_polls = 0
        # external workers' KV event mode, "events" | "approximate", as of the last poll
        self.worker_modes: dict[str, str] = {}
        # this router's rank among the live routers, as of the last poll (None before it):
        # where it lists the replicas from (router/core/candidates.py)
        self.router_rank: RouterRank | None = None
        self._first_poll: asyncio.Future | None = None
        self.marks = MarkSender(router_id, self._index,
                                MarkSharingConfig(enabled=self.config.share_marks,
                                                  share_work=self.config.share_work))
        # the routed work other routers shared, in `router.loads`
        self.remote = RemoteWork(router.loads, clock=router.clock)
        self.num_shared_received = 0  # the other routers' decisions applied here
        # route id -> replica, of the routes whose work was shared and whose end was not
        # yet: only their ends are shared (each leaves with its end, the ledger's expiry of
        # its record, or its replica). On the router's event loop only, as `marks` is.
        self._work_shared: dict[str, str] = {}

    def start(self) -> None:
        if self._first_poll is None:
            self._first_poll = asyncio.get_running_loop().create_future()
        # The long poll itself waits for news: the next starts `pace_s` after one returns.
        self._index.start(self._paced_poll, interval_s=0.0,
                          retry_interval_s=self.config.retry_interval_s)
        self.marks.start()

    def stop(self) -> None:
        self._index.stop()
        self.marks.stop()

    def share_marks(self, replica_id: str, block_hashes: Sequence[BlockHash],
                    work: RoutedWork | None = None) -> None:
        """A decision's replica, prompt blocks and the work it charged there, for the other
        routers (queued: the decision path makes no call)."""
        if self.alone():
            return
        if work is not None and self.config.share_work:
            self._work_shared[work.route_id] = replica_id
        self.marks.share(replica_id, block_hashes, work)

    def share_end(self, route_id: str, replica_id: str, withdrawn: bool = False,
                  output_tokens: int | None = None) -> None:
        """The end of a route, on `replica_id` (`withdrawn`: it never ran), if its work was
        shared: then whether this router is alone now does not matter (a router that joined
        since replays the shared log, that work included, and counts it until this end
        comes); if it was not, no router holds it, and an end would wait on the others as an
        early end that swallows a retry under the same id."""
        shared_on = self._work_shared.pop(route_id, None)
        if shared_on is None:
            return
        if shared_on != replica_id:  # chosen again since, while alone: the others hold the
            # placement that was shared, which never ran
            replica_id, withdrawn = shared_on, True
        self.marks.share_end(route_id, replica_id, withdrawn, output_tokens)

    def ended_by_relay(self, route_ids: Iterable[str]) -> None:
        """Routes whose end the index actor relayed to the other routers itself (a direct
        route's end or refusal, as its replica reported it): no end of theirs to share."""
        for route_id in route_ids:
            self._work_shared.pop(route_id, None)

    def alone(self) -> bool:
        """Whether the last poll said this is the only live router: then nothing is shared
        (a send a decision, for no reader, was a third of the index actor's calls). A router
        that joins later sees this one's work from its next decision on; the work routed
        before stays uncounted there until it ends."""
        rank = self.router_rank
        return rank is not None and rank.num_routers == 1

    async def wait_first_poll(self) -> None:
        """Waits (up to poll_timeout_s) until the mirror has been filled once, so the first
        decisions of a new router use the index rather than fall back."""
        if self.num_polls == 0:
            try:
                await asyncio.wait_for(asyncio.shield(self._first_poll), self.config.poll_timeout_s)
            except asyncio.TimeoutError:
                pass

    def check_stale(self) -> str | None:
        """The reason decisions are approximate now (None: the mirror is fresh)."""
        if self.fallback_reason is None and self._last_ok_s is not None:
            if time.monotonic() - self._last_ok_s > self.config.stale_after_s:
                self._set_fallback("stale")
        return self.fallback_reason

    def pace_s(self) -> float:
        """The pause between a reply and the next poll: poll_interval_s, scaled down with a
        fleet of fewer than pace_full_replicas replicas."""
        config = self.config
        return config.poll_interval_s * min(1.0, len(self._cursors) / config.pace_full_replicas)

    async def _paced_poll(self, index: Any) -> PollReply:
        if self.num_polls:
            await asyncio.sleep(self.pace_s())
        return await self._poll(index, self.config.poll_wait_s)

    async def poll_once(self, wait_s: float = 0.0) -> PollReply:
        return await self._index.call(lambda index: self._poll(index, wait_s))

    async def sync_once(self, wait_s: float = 0.0) -> bool:
        """One poll; on failure, approximate mode until a poll succeeds. True on success."""
        return await self._index.try_call(lambda index: self._poll(index, wait_s))

    async def _poll(self, index: Any, wait_s: float) -> PollReply:
        with self._lock:
            cursors = {**self._skipped, **self._cursors}  # gone replicas' too
            request = PollRequest(self.router_id, cursors, wait_s, self._digests(),
                                  packed=True)
        reply = await asyncio.wait_for(index.poll.remote(request),
                                       timeout=wait_s + self.config.poll_timeout_s)
        # the batches came as columns (a bytes object a call, not one a hash): their
        # objects are made here, outside the lock the routing path takes
        batches = reply.batches + tuple(reply.packed.unpack() if reply.packed else ())
        with self._lock:
            self._apply(reply, batches)
        if reply.ended_route_ids and self._on_routes_ended is not None:
            self._on_routes_ended(reply.ended_route_ids)
        if self._on_poll is not None:
            self._on_poll(reply)
        self._last_ok_s = time.monotonic()
        self.num_polls += 1
        if self._first_poll is not None and not self._first_poll.done():
            self._first_poll.set_result(None)
        if self.fallback_reason is not None:
            self._set_fallback(None)
        return reply

    def _apply(self, reply: PollReply, batches: Sequence[EventBatch] | None = None) -> None:
        """Applies a poll's reply; `batches`: its batches unpacked (else `reply.batches`)."""
        router = self.router
        self._expire_gone()
        restarted = self._incarnation not in (None, reply.incarnation)
        self._incarnation = reply.incarnation
        for replica_id in reply.removed_replica_ids:
            if restarted:  # not gone: the actor forgot it; resync when it publishes again
                self._grace[replica_id] = time.monotonic() + self.config.restart_grace_s
            else:
                self._on_removed(replica_id)
            self._cursors.pop(replica_id, None)
            self._skipped.pop(replica_id, None)
        self._end_grace(reply)
        for snap in reply.snapshots:
            if self._skip_gone(snap.replica_id, snap.epoch, snap.next_seq):
                continue
            router.apply_snapshot(snap)
            self._cursors[snap.replica_id] = Cursor(snap.epoch, snap.next_seq)
        batches = [b for b in (reply.batches if batches is None else batches)
                   if not self._skip_gone(b.replica_id, b.epoch, b.next_seq)]
        for batch, needs_snapshot in zip(batches, router.apply_batches(batches)):
            if needs_snapshot:
                self._cursors.pop(batch.replica_id, None)  # next poll brings a snapshot
            else:
                self._cursors[batch.replica_id] = Cursor(batch.epoch, batch.next_seq)
        for replica_id, stats in reply.stats.items():
            if replica_id not in self._gone:
                router.update_stats(replica_id, stats)
        self.worker_modes = reply.worker_modes
        self.router_rank = reply.router_rank
        if reply.shared_marks:
            self.num_shared_received += sum(isinstance(m, SharedMark)
                                            for m in reply.shared_marks)
        if reply.shared_marks and (self.config.share_marks or self.config.share_work):
            apply_shared_marks(router, reply.shared_marks,
                               lambda rid: rid in self._gone or rid in self._grace,
                               self.remote if self.config.share_work else None,
                               self.config.share_marks)
        if self.remote:
            self.remote.expire(frozenset(rid for rid, stats in reply.stats.items()
                                         if stats.num_running + stats.num_waiting == 0))
        if reply.snapshots or batches or reply.removed_replica_ids:  # batches: packed too
            self._view_dirty = True

    def _on_removed(self, replica_id: str) -> None:
        self._remove(replica_id)
        self._forget_shared_work(replica_id)

    def _forget_shared_work(self, replica_id: str) -> None:
        """The replica's routes leave with it, here and on the other routers: the others'
        work counted there goes, and no end of this router's is left to share."""
        self.remote.forget_replica(replica_id)
        for route_id, shared_on in list(self._work_shared.items()):
            if shared_on == replica_id:
                self._work_shared.pop(route_id, None)

    def forget_replica(self, replica_id: str) -> None:
        """The replica is gone (Serve says so): drop it here now, not at the next poll."""
        with self._lock:
            self.router.remove_replica(replica_id)
            self._forget_shared_work(replica_id)
            cursor = self._cursors.pop(replica_id, None)
            self._gone[replica_id] = (cursor.epoch if cursor else None, time.monotonic())
            if cursor is not None:
                self._skipped[replica_id] = cursor
            self._view_dirty = True

    def revive(self, replica_id: str) -> None:
        """Serve lists the replica again (it left this router's view without dying): its
        events count again from its next snapshot, not after `gone_ttl_s`."""
        with self._lock:
            self._gone.pop(replica_id, None)
            self._skipped.pop(replica_id, None)

    def _end_grace(self, reply: PollReply) -> None:
        """Replicas in restart grace that published again are resynced (their snapshot
        replaces the index); those silent past the deadline are removed."""
        if not self._grace:
            return
        for snap in reply.snapshots:
            self._grace.pop(snap.replica_id, None)
        now = time.monotonic()
        for replica_id in [r for r, deadline in self._grace.items() if deadline < now]:
            del self._grace[replica_id]
            self._on_removed(replica_id)
            self._view_dirty = True

    @property
    def replicas_in_grace(self) -> list[str]:
        return sorted(self._grace)

    def _is_gone(self, replica_id: str, epoch: str) -> bool:
        """True for data of a replica seen dead here; a new epoch (it restarted under the
        same id) brings it back."""
        gone = self._gone.get(replica_id)
        if gone is None:
            return False
        if gone[0] is not None and gone[0] != epoch:
            del self._gone[replica_id]
            self._skipped.pop(replica_id, None)
            return False
        return True

    def _skip_gone(self, replica_id: str, epoch: str, next_seq: int) -> bool:
        """`_is_gone`; for a gone replica's data, also where the next poll starts it."""
        if not self._is_gone(replica_id, epoch):
            return False
        self._skipped[replica_id] = Cursor(epoch, next_seq)
        return True

    def _expire_gone(self) -> None:
        cutoff = time.monotonic() - self.config.gone_ttl_s
        for replica_id in [r for r, (_, t) in self._gone.items() if t < cutoff]:
            del self._gone[replica_id]
            self._skipped.pop(replica_id, None)  # its next snapshot is applied

    async def report_dead(self, replica_id: str) -> None:
        """Tells the index actor now, rather than after the replica's lease runs out."""
        try:
            await self._index.call(lambda index: index.forget_replica.remote(replica_id))
        except Exception as err:  # a RayError, or the fast call's timeout or lost connection
            log.warning("could not report dead replica %s: %r", replica_id, err)

    def _digests(self) -> dict[str, ContentsDigest]:
        now = time.monotonic()
        if self._view_dirty and now - self._view_at_s >= self.config.view_refresh_s:
            self._view_at_s = now
            index = self.router.index
            self._view = {rid: contents_digest(index.held_view(rid, "device"),
                                               index.held_view(rid, "host"))
                          for rid in self._cursors}
            self._view_dirty = False
        return self._view

    def _set_fallback(self, reason: str | None) -> None:
        if reason != self.fallback_reason:
            log.info("router %s: fallback %s", self.router_id, reason or "off")
        self.fallback_reason = reason
        with self._lock:
            self.router.set_fallback(reason is not None)
