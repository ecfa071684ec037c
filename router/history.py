"""Approximate mode: what each replica probably holds, from this router's own routing.

Without KV events, a routed request's blocks are assumed cached on its replica. Each replica
keeps an LRU of at most `capacity_blocks` blocks whose entries expire `ttl_s` after they were
last routed. It is a baseline on its own and the fallback when the index actor is
unreachable or stale, so the router records into it on every decision to keep it warm.

Per replica, a FIFO of routed prompts (serial, expiry, hashes tail first) is the record;
it keeps at least the last 2 x `capacity_blocks` routed hashes and drops older prompts, so a
block not routed again within that many routed blocks is forgotten even below capacity.
While the history is `active` (approximate mode, or the fallback) it also keeps, per warm
replica, a dict hash -> serial of its latest routing (the LRU: the oldest prompt's blocks
that no later prompt refreshed are the least recently used, tail first, as the engine
evicts them) and the bitmask index that `match` walks. While inactive (events are the
truth) recording is O(1) per decision. Activation leaves every replica cold; `warm_one`
replays one replica's FIFO (an LRU's contents depend only on the order of use, so one pass
then one eviction gives the state step-by-step recording would have), so the cost of
activation (about a second per million remembered blocks) is spread over as many calls as
there are replicas. Neither structure holds per-block GC-tracked objects, so the cyclic
collector never walks them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from kv.hashing import BlockHash
from router.bulk import delete_keys, keys_stamped
from router.index import PrefixIndex, PrefixMatch


class _Routed:
    """One replica's routed blocks."""

    __slots__ = ("warm", "last_serial", "queue", "num_queued", "next_serial")

    def __init__(self, warm: bool) -> None:
        self.warm = warm  # LRU and index kept (history active, replica replayed)
        self.last_serial: dict[BlockHash, int] = {}  # only while warm
        # [serial, expires_at, hashes tail first, next position]: oldest prompt first
        self.queue: deque[list] = deque()
        self.num_queued = 0  # hashes in the queue from their entries' positions on
        self.next_serial = 0


class RoutedHistory:
    def __init__(self, capacity_blocks: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic, active: bool = True):
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self.capacity_blocks = capacity_blocks
        self.ttl_s = ttl_s
        self.clock = clock
        self.index = PrefixIndex(clock=clock)  # device medium only; no pending marks
        self._routed: dict[str, _Routed] = {}
        self._active = active
        self._cold: deque[str] = deque()  # replicas to replay, while active

    @property
    def active(self) -> bool:
        return self._active

    @property
    def warming(self) -> bool:
        """Active, with replicas not replayed yet (their matches would be empty)."""
        cold = self._cold
        while cold and (cold[0] not in self._routed or self._routed[cold[0]].warm):
            cold.popleft()
        return bool(cold)

    def set_active(self, active: bool) -> None:
        """Starts keeping the LRU and index (replicas start cold: see `warm_one`) or stops
        (dropping them)."""
        if active and not self._active:
            self._active = True
            self._cold = deque(self._routed)
        elif not active and self._active:
            self._active = False
            self._cold.clear()
            self.index = PrefixIndex(clock=self.clock)
            for routed in self._routed.values():
                routed.warm = False
                routed.last_serial = {}

    def warm_one(self) -> None:
        """Replays one cold replica's FIFO into its LRU and the index: O(2 x capacity)."""
        if not self.warming:
            return
        rid = self._cold.popleft()
        routed = self._routed[rid]
        self._expire(rid, routed, self.clock())
        routed.warm = True
        seen = routed.last_serial
        for serial, _, hashes, pos in routed.queue:
            seen.update(dict.fromkeys(hashes[pos:], serial))
        self.index.add_blocks(rid, "device", list(seen))
        if len(seen) > self.capacity_blocks:
            self._evict(rid, routed, len(seen) - self.capacity_blocks)

    def record(self, replica_id: str, block_hashes: Sequence[BlockHash]) -> None:
        """The prompt's blocks are now assumed cached on the replica."""
        now = self.clock()
        routed = self._routed.get(replica_id)
        if routed is None:  # nothing to replay: warm from the start when active
            routed = self._routed[replica_id] = _Routed(warm=self._active)
            if self._active:
                self.index.slot_of(replica_id)
        self._expire(replica_id, routed, now)
        if not block_hashes:
            return
        serial = routed.next_serial
        routed.next_serial += 1
        routed.queue.append([serial, now + self.ttl_s, tuple(reversed(block_hashes)), 0])
        routed.num_queued += len(block_hashes)
        if routed.warm:
            seen = routed.last_serial
            self.index.add_blocks(replica_id, "device",
                                  [h for h in block_hashes if h not in seen])
            seen.update(dict.fromkeys(block_hashes, serial))
            if len(seen) > self.capacity_blocks:
                self._evict(replica_id, routed, len(seen) - self.capacity_blocks)
        queue = routed.queue
        while routed.num_queued - (len(queue[0][2]) - queue[0][3]) >= 2 * self.capacity_blocks:
            self._pop_oldest(replica_id, routed)  # what is left still spans 2 x capacity

    def match(self, block_hashes: Sequence[BlockHash], replica_ids: Iterable[str]
              ) -> dict[str, PrefixMatch]:
        """Like `PrefixIndex.match`, from the routed history; needs `active` (while
        `warming`, cold replicas have no match)."""
        if not self._active:
            raise RuntimeError("RoutedHistory.match needs an active history")
        now = self.clock()
        for rid, routed in self._routed.items():
            self._expire(rid, routed, now)
        return self.index.match(block_hashes, replica_ids)

    def _expire(self, replica_id: str, routed: _Routed, now: float) -> None:
        queue = routed.queue
        while queue and queue[0][1] <= now:
            self._pop_oldest(replica_id, routed)

    def _pop_oldest(self, replica_id: str, routed: _Routed) -> None:
        """Forgets the oldest routed prompt's blocks that no later prompt refreshed."""
        serial, _, hashes, pos = routed.queue.popleft()
        routed.num_queued -= len(hashes) - pos
        if routed.warm:
            gone = keys_stamped(routed.last_serial, hashes[pos:], serial)
            delete_keys(routed.last_serial, gone)
            self.index.remove_blocks(replica_id, "device", gone)

    def _evict(self, replica_id: str, routed: _Routed, num_blocks: int) -> None:
        """Evicts `num_blocks` least recently routed blocks, oldest prompt first, tail first."""
        seen, queue = routed.last_serial, routed.queue
        gone: list[BlockHash] = []
        while len(gone) < num_blocks:
            entry = queue[0]
            serial, _, hashes, pos = entry
            live = keys_stamped(seen, hashes[pos:], serial)  # not refreshed since
            need = num_blocks - len(gone)
            if len(live) <= need:
                gone += live
                routed.num_queued -= len(hashes) - pos
                queue.popleft()
            else:  # this prompt's tail goes, its head stays
                gone += live[:need]
                end = hashes.index(live[need - 1], pos) + 1
                routed.num_queued -= end - pos
                entry[3] = end
        delete_keys(seen, gone)
        self.index.remove_blocks(replica_id, "device", gone)

    def remove_replica(self, replica_id: str) -> None:
        self._routed.pop(replica_id, None)
        self.index.remove_replica(replica_id)

    @property
    def replica_ids(self) -> list[str]:
        return list(self._routed)

    def blocks_of(self, replica_id: str) -> frozenset[BlockHash]:
        """The blocks assumed cached on the replica (active or not)."""
        routed = self._routed.get(replica_id)
        if routed is None:
            return frozenset()
        self._expire(replica_id, routed, self.clock())
        if routed.warm:
            return frozenset(routed.last_serial)
        order: dict[BlockHash, None] = {}  # least recent first, as an LRU would hold them
        for _, _, hashes, pos in routed.queue:
            for h in hashes[pos:]:
                order.pop(h, None)
                order[h] = None
        keep = list(order)[max(0, len(order) - self.capacity_blocks):]
        return frozenset(keep)

    def num_blocks(self) -> int:
        """Distinct block hashes assumed cached on any replica."""
        if self._active and not self.warming:
            return self.index.num_blocks("device")
        return len(frozenset().union(*(self.blocks_of(rid) for rid in self._routed)))

    def check_invariants(self) -> None:
        self.index.check_invariants()
        warm = {rid for rid, routed in self._routed.items() if routed.warm}
        assert set(self.index.replica_ids) == warm, "index replicas != warm replicas"
        assert self._active or not warm, "an inactive history keeps no LRU"
        for rid, routed in self._routed.items():
            seen = routed.last_serial
            assert len(seen) <= self.capacity_blocks, f"{rid} over capacity"
            if routed.warm:
                assert seen.keys() == self.index.blocks_of(rid, "device"), f"{rid} != index"
                queued = {(h, e[0]) for e in routed.queue for h in e[2][e[3]:]}
                assert all((h, s) in queued for h, s in seen.items()), f"{rid}: a block never ages"
            else:
                assert not seen, f"{rid}: a cold replica keeps no LRU"
                assert not self._active or rid in self._cold, f"{rid} cold but not queued"
            assert routed.num_queued == sum(len(e[2]) - e[3] for e in routed.queue)
            serials = [e[0] for e in routed.queue]
            assert serials == sorted(serials), f"{rid} history out of order"
            times = [e[1] for e in routed.queue]
            assert times == sorted(times), f"{rid} history out of expiry order"
        assert self.index.num_blocks("host") == 0, "history has no host tier"
