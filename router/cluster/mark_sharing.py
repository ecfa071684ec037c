"""A router's side of shared pending marks and routed work (router/cluster/shared_marks.py).

Sending: the routing path only appends the decision's replica, the prompt's block hashes
and the work it charged there to an outbox (no Ray call, no walk), and a request's end
appends its `WorkEnd`. A send carries the whole outbox to the index actor, on the router's
event loop, as soon as the decision is done; up to `max_sends_in_flight` calls at a time,
so a mark never waits for another's round trip while calls are few, and past that the
outbox batches itself until one returns. (One call at a time cost a mark that round trip:
live, a mark queued behind one reached the other router 9 ms late, after the whole next
request of the same prefix had been routed there.) Work ends are not in such a hurry (an
ended request counts on the other routers that much longer): one starts a send of its own
no sooner than `min_end_send_gap_s` after the last send, and meanwhile rides with the next
decision's marks. Each send is a call to the actor and wakes every other router's poll;
a busy router's ends, one send each, doubled what its decisions cost there. Calls in
flight together may run out of order at the actor; marks do not mind, and a work end that
overtakes its route is kept for it (remote_work.py).

Receiving: each poll reply brings the other routers' messages, applied in their order. Marks
become timed marks (`PendingMarks.mark`, expiring after the router's `pending_ttl_s`) on
replicas this router routes on events; the leading blocks this router's index already
confirms there are left unmarked: an event confirmed them, and a mark on them would outlive
their eviction. Routed work joins this router's load until its end
(router/cluster/remote_work.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kv.hashing import BlockHash
from router.cluster.actor_link import ActorLink
from router.cluster.remote_work import RemoteWork
from router.cluster.shared_marks import (
    RoutedWork,
    Shared,
    SharedGap,
    SharedMark,
    WorkEnd,
    size_of,
)
from router.core.router import Router

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MarkSharingConfig:
    enabled: bool = True  # pending marks
    share_work: bool = True  # routed work and its ends
    max_outbox_blocks: int = 1 << 16  # hashes waiting to be sent; the oldest go first
    max_mark_blocks: int = 4096  # of one prompt (its first ones), as the actor keeps them
    max_sends_in_flight: int = 4  # calls to the index actor at once
    # A send for work ends alone starts no sooner than this after the last send (a lone
    # end on a quiet router at once); marks go at once and carry the ends queued. 0: each
    # end is sent as a mark is.
    min_end_send_gap_s: float = 0.01

    def __post_init__(self):
        for name in ("max_outbox_blocks", "max_mark_blocks", "max_sends_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"MarkSharingConfig: {name} must be >= 1, "
                                 f"got {getattr(self, name)}")
        if not 0 <= self.min_end_send_gap_s <= 1:
            raise ValueError(f"MarkSharingConfig: min_end_send_gap_s must be in [0, 1] s, "
                             f"got {self.min_end_send_gap_s}")


class MarkOutbox:
    """The messages this router queued, not yet sent; at most `max_blocks` hashes (a
    message with none counts one). Past that the oldest marks lose their hashes first (a
    lost mark costs a prefill at worst) and keep their work; only then do the oldest work
    and ends go (a lost end leaves its route counted on the other routers for their
    `lost_after_s` while its replica is busy)."""

    def __init__(self, max_blocks: int):
        self._max_blocks = max_blocks
        self._bare: deque[Shared] = deque()  # the oldest messages, with no hashes left
        self._marks: deque[Shared] = deque()  # the newer ones, as queued
        self._num_blocks = 0
        self.num_dropped_blocks = 0  # hashes dropped: sends that could not keep up
        self.num_dropped_work = 0  # routed work and ends dropped, when that was not enough

    def __len__(self) -> int:
        return len(self._bare) + len(self._marks)

    def add(self, replica_id: str, block_hashes: tuple[BlockHash, ...],
            work: RoutedWork | None = None) -> None:
        self.put(SharedMark(replica_id, block_hashes, work))

    def put(self, message: Shared) -> None:
        self._marks.append(message)
        self._num_blocks += size_of(message)
        while self._num_blocks > self._max_blocks and self._marks:
            oldest = self._marks.popleft()
            self._num_blocks -= size_of(oldest)
            if isinstance(oldest, SharedMark):
                self.num_dropped_blocks += len(oldest.block_hashes)
                if oldest.work is None:
                    continue
                oldest = oldest._replace(block_hashes=())
            self._bare.append(oldest)  # it counts one now
            self._num_blocks += 1
        while self._num_blocks > self._max_blocks:
            self._bare.popleft()
            self._num_blocks -= 1
            self.num_dropped_work += 1

    def take(self) -> tuple[Shared, ...]:
        marks = (*self._bare, *self._marks)
        self._bare.clear()
        self._marks.clear()
        self._num_blocks = 0
        return marks


class MarkSender:
    """Sends a router's marks and work to the index actor, up to `max_sends_in_flight`
    calls at a time."""

    def __init__(self, router_id: str, index: ActorLink, config: MarkSharingConfig,
                 clock: Callable[[], float] = time.monotonic):
        """`clock`: times the gap before a send of work ends alone (tests fake it)."""
        self.router_id = router_id
        self.config = config
        self._index = index
        self._clock = clock
        self.outbox = MarkOutbox(config.max_outbox_blocks)
        self._tasks: set[asyncio.Task] = set()
        self._starting = False  # a send task is created and has not taken the outbox yet
        self._started = False
        self._marks_queued = False  # the outbox holds more than work ends
        self._last_send_s = float("-inf")  # when the last send took the outbox (`clock()`)
        self._ends_timer: asyncio.TimerHandle | None = None  # the gap's end, when armed
        self.num_sends = 0
        self.num_shared_decisions = 0  # queued by `share`

    def start(self) -> None:
        """Sends from now on (with the mirror's polls; until then marks only queue)."""
        self._started = True
        self._send_due()

    def share(self, replica_id: str, block_hashes: Sequence[BlockHash],
              work: RoutedWork | None = None) -> None:
        """Queues a decision's marks and work (None: none charged); called on the router's
        event loop, under no lock."""
        config = self.config
        hashes = tuple(block_hashes[:config.max_mark_blocks]) if config.enabled else ()
        work = work if config.share_work else None
        if not (hashes or work):
            return
        self.outbox.add(replica_id, hashes, work)
        self._marks_queued = True
        self.num_shared_decisions += 1
        self._send_soon()

    def share_end(self, route_id: str, replica_id: str, withdrawn: bool = False,
                  output_tokens: int | None = None) -> None:
        """Queues the end of a route whose work was shared, on `replica_id` (`withdrawn`: it
        never ran)."""
        if self.config.share_work:
            self.outbox.put(WorkEnd(route_id, replica_id, withdrawn, output_tokens))
            self._send_due()

    def _send_due(self) -> None:
        """Sends the outbox now if it holds marks or the ends' gap has passed; else at the
        gap's end (unless a mark's send takes the ends first)."""
        if self._marks_queued:
            self._send_soon()
            return
        if not (self._started and self.outbox) or self._ends_timer is not None:
            return
        wait_s = self._last_send_s + self.config.min_end_send_gap_s - self._clock()
        if wait_s <= 0:
            self._send_soon()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called off the loop: sent with the next share on it
            return
        self._ends_timer = loop.call_later(wait_s, self._gap_passed)

    def _gap_passed(self) -> None:
        self._ends_timer = None
        self._send_soon()

    def _send_soon(self) -> None:
        if (self._started and self.outbox and not self._starting
                and len(self._tasks) < self.config.max_sends_in_flight):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called off the loop: sent with the next share on it
                return
            self._starting = True
            task = loop.create_task(self._send())
            self._tasks.add(task)
            task.add_done_callback(self._sent)

    async def _send(self) -> None:
        """Sends what the outbox holds when this task runs: what the rest of the decision
        (its expired records' ends) queued goes with its marks, in one call."""
        self._starting = False
        marks = self.outbox.take()
        if not marks:
            return
        self._marks_queued = False
        self._last_send_s = self._clock()
        try:
            await self._index.call(
                lambda index: index.share_marks.remote(self.router_id, marks))
            self.num_sends += 1
        except Exception as err:  # the actor is away: these marks are lost (events confirm
            # the blocks later, the remote work's safety nets drop its routes); the poll
            # loop reports the outage
            log.debug("router %s: marks not shared: %r", self.router_id, err)

    def _sent(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._send_due()  # what queued while every call was in flight

    async def drain(self) -> None:
        """Returns once every queued mark and work end was sent (or given up on)."""
        while True:
            if self._ends_timer is not None:  # the ends go now, not after their gap
                self._ends_timer.cancel()
                self._ends_timer = None
                self._send_soon()
            if not self._tasks:
                return
            await asyncio.gather(*map(asyncio.shield, list(self._tasks)),
                                 return_exceptions=True)

    def stop(self) -> None:
        self._started = False  # a cancelled call's end starts no other
        if self._ends_timer is not None:
            self._ends_timer.cancel()
            self._ends_timer = None
        for task in list(self._tasks):
            task.cancel()


def apply_shared_marks(router: Router, marks: Sequence[Shared],
                       skip: Callable[[str], bool], remote: RemoteWork | None = None,
                       apply_marks: bool = True) -> int:
    """Applies other routers' messages in their order (call under the router's lock): marks
    (unless not `apply_marks`) as timed marks, skipping replicas this router does not know,
    routes on history, or `skip` names; routed work and its ends into `remote` (None:
    ignored), skipping replicas `skip` names; after a gap, `remote` counts none of the
    routes it had (their ends may have been dropped). Returns how many hashes were marked."""
    index = router.index
    num_marked = 0
    for message in marks:
        if isinstance(message, (WorkEnd, SharedGap)):
            if remote is not None and isinstance(message, WorkEnd):
                remote.end(message)
            elif remote is not None:
                remote.lose_all()
            continue
        replica_id, block_hashes, work = message
        if skip(replica_id):
            continue
        if work is not None and remote is not None:
            remote.add(replica_id, work)
        if not (apply_marks and block_hashes) or replica_id not in index or (
                router.is_approximate(replica_id)):
            continue
        k = index.num_confirmed_device_blocks(replica_id, block_hashes)
        if k < len(block_hashes):
            index.mark_pending(replica_id, block_hashes[k:])
            num_marked += len(block_hashes) - k
    return num_marked
