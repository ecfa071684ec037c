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
truth) recording is O(1) per decision. Activation leaves every replica cold; `warm_step`
replays about 2,048 routed hashes of cold replicas' FIFOs, oldest first (an LRU's contents
depend only on the order of use, so a replay ends in the state step-by-step recording would
have), so the cost of activation (about a second per million remembered blocks) is spread
over many calls. Neither structure holds per-block GC-tracked objects, so the cyclic
collector never walks them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import islice
from typing import NamedTuple

import numpy as np

from kv.hashing import BlockHash
from router.core.block_table import HASH_BYTES
from router.core.hash_loops import delete_keys, keys_stamped
from router.core.index import PrefixIndex, PrefixMatch

_HASH_DTYPE = np.dtype(f"V{HASH_BYTES}")  # one hash: .tolist() gives bytes objects


class _RoutedPrompt(NamedTuple):
    """One routed prompt in a replica's FIFO."""

    serial: int  # the replica's count of routed prompts before this one
    expires_at_s: float  # on the history's clock
    # The prompt's block hashes joined in prompt order: one bytes object, not a container of
    # 512 hashes that every young-generation collection of the cyclic GC would walk while
    # the prompt is remembered (the cost of a collection landed in one decision).
    joined_hashes: bytes
    num_evicted: int  # trailing blocks evicted already (tail first)

    @property
    def num_live(self) -> int:
        return len(self.joined_hashes) // HASH_BYTES - self.num_evicted

    def hashes_tail_first(self) -> list[BlockHash]:
        """Every block hash of the prompt, last block first (evicted ones included)."""
        return np.frombuffer(self.joined_hashes, _HASH_DTYPE)[::-1].tolist()

    @property
    def live_hashes(self) -> list[BlockHash]:
        """The hashes not evicted yet, last block first."""
        return np.frombuffer(self.joined_hashes, _HASH_DTYPE)[:self.num_live][::-1].tolist()


class _Routed:
    """One replica's routed blocks."""

    __slots__ = ("warm", "replaying", "num_replayed", "last_serial", "queue", "num_queued",
                 "next_serial")

    def __init__(self, warm: bool) -> None:
        self.warm = warm  # LRU and index kept for every entry (history active, replayed)
        self.replaying = False  # being warmed: LRU and index kept for the first entries
        self.num_replayed = 0  # while replaying: leading queue entries in the LRU and index
        self.last_serial: dict[BlockHash, int] = {}  # only while warm or replaying
        self.queue: deque[_RoutedPrompt] = deque()  # oldest prompt first
        self.num_queued = 0  # live hashes in the queue (not evicted)
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
        """Starts keeping the LRU and index (replicas start cold: see `warm_step`) or stops
        (dropping them)."""
        if active and not self._active:
            self._active = True
            self._cold = deque(self._routed)
        elif not active and self._active:
            self._active = False
            self._cold.clear()
            self.index = PrefixIndex(clock=self.clock)
            for routed in self._routed.values():
                routed.warm = routed.replaying = False
                routed.num_replayed = 0
                routed.last_serial = {}

    def warm_step(self, budget_blocks: int = 2048) -> None:
        """Replays about `budget_blocks` routed hashes of cold replicas into their LRU and
        the index, oldest first (whole prompts, so a little more)."""
        now = self.clock()
        while budget_blocks > 0 and self.warming:
            rid = self._cold[0]
            routed = self._routed[rid]
            if not routed.replaying:
                self._expire(rid, routed, now)
                routed.replaying = True
                self.index.slot_of(rid)
            seen = routed.last_serial
            for prompt in islice(routed.queue, routed.num_replayed, None):
                serial, part = prompt.serial, prompt.live_hashes
                self.index.add_blocks(rid, "device", [h for h in part if h not in seen])
                seen.update(dict.fromkeys(part, serial))
                routed.num_replayed += 1
                budget_blocks -= len(part)
                if budget_blocks <= 0:
                    break
            if len(seen) > self.capacity_blocks:
                self._evict(rid, routed, len(seen) - self.capacity_blocks)
            if routed.num_replayed == len(routed.queue):
                routed.warm, routed.replaying, routed.num_replayed = True, False, 0
                self._cold.popleft()

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
        joined = b"".join(block_hashes)
        if len(joined) != HASH_BYTES * len(block_hashes):
            raise ValueError(f"block hashes must be {HASH_BYTES} bytes each")
        serial = routed.next_serial
        routed.next_serial += 1
        routed.queue.append(_RoutedPrompt(serial, now + self.ttl_s, joined, 0))
        routed.num_queued += len(block_hashes)
        if routed.warm:
            seen = routed.last_serial
            self.index.add_blocks(replica_id, "device",
                                  [h for h in block_hashes if h not in seen])
            seen.update(dict.fromkeys(block_hashes, serial))
            if len(seen) > self.capacity_blocks:
                self._evict(replica_id, routed, len(seen) - self.capacity_blocks)
        queue = routed.queue
        while routed.num_queued - queue[0].num_live >= 2 * self.capacity_blocks:
            self._pop_oldest(replica_id, routed)  # what is left still spans 2 x capacity

    def match(self, block_hashes: Sequence[BlockHash], replica_ids: Iterable[str],
              confirmed: dict[str, int] | None = None) -> Mapping[str, PrefixMatch]:
        """Like `PrefixIndex.match`, from the routed history; needs `active` (while
        `warming`, cold replicas have no match). There are no pending marks here, so
        `confirmed` stays as given."""
        if not self._active:
            raise RuntimeError("RoutedHistory.match needs an active history")
        now = self.clock()
        for rid, routed in self._routed.items():
            self._expire(rid, routed, now)
        return self.index.match(block_hashes, replica_ids)

    def _expire(self, replica_id: str, routed: _Routed, now: float) -> None:
        queue = routed.queue
        while queue and queue[0].expires_at_s <= now:
            self._pop_oldest(replica_id, routed)

    def _pop_oldest(self, replica_id: str, routed: _Routed) -> None:
        """Forgets the oldest routed prompt's blocks that no later prompt refreshed."""
        prompt = routed.queue.popleft()
        routed.num_queued -= prompt.num_live
        if routed.replaying and routed.num_replayed:
            routed.num_replayed -= 1
        elif not routed.warm:
            return  # not in the LRU yet
        gone = keys_stamped(routed.last_serial, prompt.live_hashes, prompt.serial)
        delete_keys(routed.last_serial, gone)
        self.index.remove_blocks(replica_id, "device", gone)

    def _evict(self, replica_id: str, routed: _Routed, num_blocks: int) -> None:
        """Evicts `num_blocks` least recently routed blocks, oldest prompt first, tail first."""
        seen, queue = routed.last_serial, routed.queue
        gone: list[BlockHash] = []
        while len(gone) < num_blocks:
            prompt = queue[0]
            hashes, pos = prompt.hashes_tail_first(), prompt.num_evicted
            live = keys_stamped(seen, hashes[pos:], prompt.serial)  # not refreshed since
            need = num_blocks - len(gone)
            if len(live) <= need:
                gone += live
                routed.num_queued -= len(hashes) - pos
                queue.popleft()
                if routed.replaying:
                    routed.num_replayed -= 1
            else:  # this prompt's tail goes, its head stays
                gone += live[:need]
                end = hashes.index(live[need - 1], pos) + 1
                routed.num_queued -= end - pos
                queue[0] = prompt._replace(num_evicted=end)
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
        for prompt in routed.queue:
            for h in prompt.live_hashes:
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
        kept = {rid for rid, routed in self._routed.items() if routed.warm or routed.replaying}
        assert set(self.index.replica_ids) == kept, "index replicas != warm or replaying ones"
        assert self._active or not kept, "an inactive history keeps no LRU"
        for rid, routed in self._routed.items():
            seen = routed.last_serial
            assert len(seen) <= self.capacity_blocks, f"{rid} over capacity"
            assert not (routed.warm and routed.replaying), f"{rid} warm and replaying"
            if routed.warm or routed.replaying:
                assert seen.keys() == self.index.blocks_of(rid, "device"), f"{rid} != index"
                entries = list(routed.queue)
                if routed.replaying:
                    assert routed.num_replayed <= len(entries), f"{rid} replayed too far"
                    entries = entries[: routed.num_replayed]
                queued = {(h, e.serial) for e in entries for h in e.live_hashes}
                assert all((h, s) in queued for h, s in seen.items()), f"{rid}: a block never ages"
            else:
                assert not seen, f"{rid}: a cold replica keeps no LRU"
            if self._active and not routed.warm:
                assert rid in self._cold, f"{rid} cold but not queued for warming"
            assert all(len(e.joined_hashes) % HASH_BYTES == 0 and 0 <= e.num_evicted
                       and e.num_live > 0 for e in routed.queue), f"{rid}: a prompt's hashes"
            assert routed.num_queued == sum(len(e.live_hashes) for e in routed.queue)
            serials = [e.serial for e in routed.queue]
            assert serials == sorted(serials), f"{rid} history out of order"
            times = [e.expires_at_s for e in routed.queue]
            assert times == sorted(times), f"{rid} history out of expiry order"
        assert self.index.num_blocks("host") == 0, "history has no host tier"
