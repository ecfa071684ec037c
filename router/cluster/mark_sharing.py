"""A router's side of shared pending marks (router/cluster/shared_marks.py).

Sending: the routing path only appends the decision's replica and the prompt's block hashes
to an outbox (no Ray call, no walk). One send at a time carries the whole outbox to the
index actor, on the router's event loop; marks set while a send is in flight go with the
next, so sends batch themselves under load and cost one round trip of delay when idle.

Receiving: each poll reply brings the marks the other routers set; they become timed marks
(`PendingMarks.mark`, expiring after the router's `pending_ttl_s`) on replicas this router
routes on events. The leading blocks this router's index already confirms there are left
unmarked: an event confirmed them, and a mark on them would outlive their eviction.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kv.hashing import BlockHash
from router.cluster.actor_link import ActorLink
from router.cluster.shared_marks import SharedMark
from router.core.router import Router

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MarkSharingConfig:
    enabled: bool = True
    max_outbox_blocks: int = 1 << 16  # hashes waiting to be sent; the oldest go first
    max_mark_blocks: int = 4096  # of one prompt (its first ones), as the actor keeps them

    def __post_init__(self):
        for name in ("max_outbox_blocks", "max_mark_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"MarkSharingConfig: {name} must be >= 1, "
                                 f"got {getattr(self, name)}")


class MarkOutbox:
    """The marks this router set, not yet sent; at most `max_blocks` hashes."""

    def __init__(self, max_blocks: int):
        self._max_blocks = max_blocks
        self._marks: deque[SharedMark] = deque()
        self._num_blocks = 0
        self.num_dropped_blocks = 0  # sends that could not keep up

    def __len__(self) -> int:
        return len(self._marks)

    def add(self, replica_id: str, block_hashes: tuple[BlockHash, ...]) -> None:
        self._marks.append(SharedMark(replica_id, block_hashes))
        self._num_blocks += len(block_hashes)
        while self._num_blocks > self._max_blocks:
            n = len(self._marks.popleft().block_hashes)
            self._num_blocks -= n
            self.num_dropped_blocks += n

    def take(self) -> tuple[SharedMark, ...]:
        marks = tuple(self._marks)
        self._marks.clear()
        self._num_blocks = 0
        return marks


class MarkSender:
    """Sends a router's marks to the index actor, one call in flight at a time."""

    def __init__(self, router_id: str, index: ActorLink, config: MarkSharingConfig):
        self.router_id = router_id
        self.config = config
        self._index = index
        self.outbox = MarkOutbox(config.max_outbox_blocks)
        self._task: asyncio.Task | None = None
        self._started = False
        self.num_sends = 0

    def start(self) -> None:
        """Sends from now on (with the mirror's polls; until then marks only queue)."""
        self._started = True
        self._send_soon()

    def share(self, replica_id: str, block_hashes: Sequence[BlockHash]) -> None:
        """Queues a decision's marks; called on the router's event loop, under no lock."""
        if not (self.config.enabled and block_hashes):
            return
        self.outbox.add(replica_id, tuple(block_hashes[:self.config.max_mark_blocks]))
        self._send_soon()

    def _send_soon(self) -> None:
        if self._started and self._task is None and self.outbox:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called off the loop: sent with the next share on it
                return
            self._task = loop.create_task(self._send_all())

    async def _send_all(self) -> None:
        try:
            while self.outbox:
                marks = self.outbox.take()
                try:
                    await self._index.call(
                        lambda index, marks=marks: index.share_marks.remote(self.router_id,
                                                                            marks))
                    self.num_sends += 1
                except Exception as err:  # the actor is away: these marks are lost (events
                    # confirm the blocks later); the poll loop reports the outage
                    log.debug("router %s: marks not shared: %r", self.router_id, err)
        finally:
            self._task = None

    async def drain(self) -> None:
        """Returns once every queued mark was sent (or given up on)."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def apply_shared_marks(router: Router, marks: Sequence[SharedMark],
                       skip: Callable[[str], bool]) -> int:
    """Applies other routers' marks as timed marks (call under the router's lock); skips
    replicas this router does not know, routes on history, or `skip` names. Returns how
    many hashes were marked."""
    index = router.index
    num_marked = 0
    for replica_id, block_hashes in marks:
        if replica_id not in index or router.is_approximate(replica_id) or skip(replica_id):
            continue
        k = index.num_confirmed_device_blocks(replica_id, block_hashes)
        if k < len(block_hashes):
            index.mark_pending(replica_id, block_hashes[k:])
            num_marked += len(block_hashes) - k
    return num_marked
