"""Ray actors for bench_index_actor.py: replicas that publish to the KV index actor, and
mirrors that follow it, each recording when every batch left and when it arrived.

A `FeedPublisher` process plays many replicas (event_shapes.ReplicaFeed), each on its own
50 ms tick (phases spread over the interval), with one publish in flight per replica like
router/serve/publisher.py: a tick that finds the last publish unanswered adds its events to
the next batch. A `MirrorProbe` is a router process's mirror: a real `IndexMirror` into a
real `Router`, or only the long poll (`apply_to_router=False`).

Each calls the shards through Ray, or (`calls="fast"`) as the product's `find_index` hands
out the index actor: its per-request calls and a relay's `publish_packed` over the actor's
ZMQ socket (router/cluster/fast_calls.py), everything else through Ray.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from array import array
from collections.abc import Coroutine
from dataclasses import dataclass, fields

import numpy as np
import ray

from benchmarks.simlib.event_shapes import BatchShape, ReplicaFeed, hash_ring
from kv.events import Cursor, EventBatch
from router.cluster.fast_calls import FastCallConfig, FastHandle, reach_fast_calls
from router.cluster.index_actor import PollReply, PollRequest
from router.cluster.index_mirror import IndexMirror, MirrorConfig
from router.cluster.packed_batches import PackedBatches
from router.core.router import Router, RouterConfig

SLOTS_PER_INTERVAL = 10  # replicas publish at 10 phases of the interval
# Every fast call's timeout here (a poll's too), as Ray's calls have none: an overloaded
# actor answers late, which the bench measures as lag; the product's few seconds would
# turn that into failed calls (counted: call_errors).
FAST_CALL_TIMEOUT_S = 120.0


async def shard_handles(shards: list, calls: str) -> list:
    """The handles this process calls the shards by: Ray's (`calls="ray"`), or each with
    its fast calls (`"fast"`), which must answer (no silent fall back to Ray)."""
    if calls == "ray":
        return list(shards)
    if calls != "fast":
        raise ValueError(f"calls must be ray or fast, got {calls!r}")
    config = FastCallConfig(**{f.name: FAST_CALL_TIMEOUT_S for f in fields(FastCallConfig)
                               if f.name.endswith("timeout_s") and f.name != "ping_timeout_s"})
    handles = []
    for shard in shards:
        handle = await asyncio.to_thread(reach_fast_calls, shard, config)
        if not isinstance(handle, FastHandle):
            raise RuntimeError("an index shard's fast calls did not answer")
        handles.append(handle)
    return handles


def replica_number(replica_id: str) -> int:
    return int(replica_id[1:])  # "b17" -> 17


def shard_of(replica_id: str, num_shards: int) -> int:
    """The index shard that owns a replica (any stable function of its id would do)."""
    return replica_number(replica_id) % num_shards


@dataclass
class _Pending:
    in_flight: bool = False
    owed: int = 0  # ticks whose events wait for the next send
    owed_since_s: float = 0.0  # the first such tick (wall clock)


@ray.remote(num_cpus=0)
class FeedPublisher:
    def __init__(self, replica_ids: list[str], shapes: tuple[tuple[BatchShape, ...], ...],
                 ring_blocks: int, held_blocks: int):
        ring = hash_ring(ring_blocks)
        self._feeds = []
        for rid in replica_ids:
            k = replica_number(rid)
            self._feeds.append(ReplicaFeed(rid, shapes[k % len(shapes)], ring,
                                           offset=k * 7919 % ring_blocks,
                                           held_blocks=held_blocks,
                                           start_batch=k // len(shapes) * 101))
        self._tasks: set[asyncio.Task] = set()
        self._rows: tuple[array, array, array] = (array("q"), array("q"), array("d"))
        self._shards: list = []
        self.num_blocks_acked = 0
        self.num_publishes = 0
        self.num_errors = 0  # publishes that failed (their blocks are not acked)
        self.num_snapshots = 0
        self.last_ack_s = 0.0

    def pid(self) -> int:
        return os.getpid()

    async def connect(self, shards: list, calls: str) -> None:
        """The shards every later call goes to, through Ray or with fast calls."""
        self._shards = await shard_handles(shards, calls)

    async def publish_snapshots(self) -> None:
        shards = self._shards
        await asyncio.gather(*[
            shards[shard_of(f.replica_id, len(shards))].publish_snapshot.remote(
                f.snapshot(), f.stats()) for f in self._feeds])

    async def heartbeat(self) -> None:
        """Every replica's empty batch, one packed call a shard: real replicas heartbeat
        every second while idle (router/serve/publisher.py), so while the mirrors take
        their first snapshots none stays silent past the actor's replica_timeout_s."""
        shards = self._shards
        for k, shard in enumerate(shards):
            feeds = [f for f in self._feeds if shard_of(f.replica_id, len(shards)) == k]
            if feeds:
                stale = await shard.publish_packed.remote(
                    PackedBatches.pack([EventBatch(f.replica_id, f.epoch, f.next_seq, ())
                                        for f in feeds]), {})
                await asyncio.gather(*[shard.publish_snapshot.remote(f.snapshot(), f.stats())
                                       for f in feeds if f.replica_id in stale])

    async def run(self, start_s: float, duration_s: float, interval_s: float,
                  relay: bool = False) -> dict:
        """Publishes every replica's batches to the shard that owns it, each replica every
        `interval_s` from `start_s` (wall clock) for `duration_s`. `relay`: the replicas due
        at one phase go to each shard in one packed call (a node's relay), not a call each."""
        shards = self._shards
        owners = [shards[shard_of(f.replica_id, len(shards))] for f in self._feeds]
        pending = [_Pending() for _ in self._feeds]
        slot_s = interval_s / SLOTS_PER_INTERVAL
        for tick in range(int(duration_s / interval_s)):
            for slot in range(SLOTS_PER_INTERVAL):
                due_s = start_s + tick * interval_s + slot * slot_s
                delay_s = due_s - time.time()
                if delay_s > 0:
                    await asyncio.sleep(delay_s)  # the replicas' publish clock
                sendable = []
                for j in range(slot, len(self._feeds), SLOTS_PER_INTERVAL):
                    state = pending[j]
                    if state.owed == 0:
                        state.owed_since_s = due_s
                    state.owed += 1
                    if not state.in_flight:
                        sendable.append(j)
                if not relay:
                    for j in sendable:
                        self._send(owners[j], j, pending[j])
                    continue
                for shard in shards:
                    mine = [j for j in sendable if owners[j] is shard]
                    if mine:
                        self._send_packed(shard, mine, [pending[j] for j in mine])
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        replica, next_seq, t = self._rows
        owed = sum(f.owed_blocks(s.owed) for f, s in zip(self._feeds, pending))
        return {"published": {"replica": np.frombuffer(replica, dtype=np.int64),
                              "next_seq": np.frombuffer(next_seq, dtype=np.int64),
                              "t": np.frombuffer(t, dtype=np.float64)},
                "num_blocks_acked": self.num_blocks_acked,
                "num_blocks_due": self.num_blocks_acked + owed,
                "last_ack_s": self.last_ack_s, "num_publishes": self.num_publishes,
                "num_errors": self.num_errors,
                "num_snapshots": self.num_snapshots,
                "final_seq": {replica_number(f.replica_id): f.next_seq for f in self._feeds}}

    def _take(self, j: int, state: _Pending) -> tuple[EventBatch, int]:
        """Replica j's next batch of what it owes, its blocks counted; its row recorded
        when it carries events. The replica owes nothing and waits for the ack."""
        feed = self._feeds[j]
        sent_before = feed.num_blocks_sent
        batch = feed.next_batch(state.owed)
        if batch.events:
            for column, value in zip(self._rows, (replica_number(feed.replica_id),
                                                  batch.next_seq, state.owed_since_s)):
                column.append(value)
        state.owed, state.in_flight = 0, True
        return batch, feed.num_blocks_sent - sent_before

    def _send(self, index, j: int, state: _Pending) -> None:
        batch, num_blocks = self._take(j, state)
        self._start(self._publish(index, self._feeds[j], state, batch, num_blocks))

    def _send_packed(self, index, js: list[int], states: list[_Pending]) -> None:
        taken = [self._take(j, state) for j, state in zip(js, states)]
        self._start(self._publish_packed(index, js, states, [b for b, _ in taken],
                                         sum(n for _, n in taken)))

    def _start(self, publish: Coroutine) -> None:
        task = asyncio.get_running_loop().create_task(publish)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish_packed(self, index, js: list[int], states: list[_Pending],
                              batches: list[EventBatch], num_blocks: int) -> None:
        feeds = [self._feeds[j] for j in js]
        try:
            stale = await index.publish_packed.remote(
                PackedBatches.pack(batches), {f.replica_id: f.stats() for f in feeds})
            self._acked(num_blocks)
            for feed in feeds:
                if feed.replica_id in stale:
                    self.num_snapshots += 1
                    await index.publish_snapshot.remote(feed.snapshot(), feed.stats())
        except Exception:
            self.num_errors += 1
        finally:
            for state in states:
                state.in_flight = False
            self.num_publishes += 1

    async def _publish(self, index, feed: ReplicaFeed, state: _Pending, batch: EventBatch,
                       num_blocks: int) -> None:
        stats = feed.stats()
        try:
            needs_snapshot = await index.publish.remote(batch, stats)
            self._acked(num_blocks)
            if needs_snapshot:
                self.num_snapshots += 1
                await index.publish_snapshot.remote(feed.snapshot(), stats)
        except Exception:
            self.num_errors += 1
        finally:
            state.in_flight = False
            self.num_publishes += 1

    def _acked(self, num_blocks: int) -> None:
        self.num_blocks_acked += num_blocks
        self.last_ack_s = time.time()


@ray.remote(num_cpus=0)
class MirrorProbe:
    def __init__(self, router_id: str, apply_to_router: bool, packed: bool = True,
                 poll_interval_s: float | None = None):
        self.router_id = router_id
        # between a reply and the next poll (IndexMirror's own default if None)
        self._poll_interval_s = (MirrorConfig().poll_interval_s if poll_interval_s is None
                                 else poll_interval_s)
        self._apply = apply_to_router
        self._packed = packed  # bare polls: replies as columns (IndexMirror's always are)
        self._rows: tuple[array, array, array] = (array("q"), array("q"), array("d"))
        self._max_seq: dict[int, int] = {}
        self._num_blocks = 0
        self._poll_t = array("d")  # when each reply came (a call's fixed cost is per poll)
        self._last_s: float | None = None
        self._mirrors: list[IndexMirror] = []
        self._tasks: list[asyncio.Task] = []
        self._replicas_seen = asyncio.Event()
        self._num_replicas_wanted = 1 << 62
        self.num_errors = 0  # bare polls that failed (an IndexMirror's go to its fallback)

    def pid(self) -> int:
        return os.getpid()

    async def start(self, shards: list, calls: str = "ray") -> None:
        """Follows every shard: one IndexMirror per shard, all into this process's one
        Router (each mirror keeps the cursors of its shard's replicas), or one bare poll
        loop per shard; through Ray or with fast calls (`calls`)."""
        shards = await shard_handles(shards, calls)
        if self._apply:
            router, lock = Router(RouterConfig()), threading.Lock()
            for index in shards:
                mirror = IndexMirror(router, self.router_id, lock, index=index,
                                     config=MirrorConfig(
                                         share_marks=False,
                                         poll_interval_s=self._poll_interval_s),
                                     on_poll=self._record)
                mirror.start()
                self._mirrors.append(mirror)
        else:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._receive(index)) for index in shards]

    async def wait_replicas(self, num_replicas: int, timeout_s: float) -> bool:
        """True once this mirror has had every replica's snapshot."""
        self._num_replicas_wanted = num_replicas
        if len(self._max_seq) >= num_replicas:
            return True
        try:
            await asyncio.wait_for(self._replicas_seen.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    def caught_up(self, final_seq: dict[int, int]) -> bool:
        return all(self._max_seq.get(k, -1) >= s for k, s in final_seq.items())

    def take_records(self) -> dict:
        replica, next_seq, t = self._rows
        return {"replica": np.frombuffer(replica, dtype=np.int64),
                "next_seq": np.frombuffer(next_seq, dtype=np.int64),
                "t": np.frombuffer(t, dtype=np.float64),
                "num_blocks": self._num_blocks,
                "poll_t": np.frombuffer(self._poll_t, dtype=np.float64),
                "last_s": self._last_s,
                "num_errors": self.num_errors}

    def stop(self) -> None:
        for mirror in self._mirrors:
            mirror.stop()
        for task in self._tasks:
            task.cancel()

    async def _receive(self, index) -> None:
        cursors: dict[str, Cursor] = {}
        while True:
            try:
                reply = await index.poll.remote(PollRequest(self.router_id, dict(cursors),
                                                            1.0, packed=self._packed))
            except Exception:  # counted; the next poll, paced, asks from the same cursors
                self.num_errors += 1
                await asyncio.sleep(self._poll_interval_s)
                continue
            for snap in reply.snapshots:
                cursors[snap.replica_id] = Cursor(snap.epoch, snap.next_seq)
            for batch in reply.batches:
                cursors[batch.replica_id] = Cursor(batch.epoch, batch.next_seq)
            if reply.packed is not None:
                packed = reply.packed
                for replica_id, epoch, next_seq in zip(packed.replica_ids, packed.epochs,
                                                       packed.next_seqs()):
                    cursors[replica_id] = Cursor(epoch, next_seq)
            for replica_id in reply.removed_replica_ids:
                cursors.pop(replica_id, None)
            self._record(reply)
            await asyncio.sleep(self._poll_interval_s)  # paced as IndexMirror is

    def _record(self, reply: PollReply) -> None:
        now_s = time.time()
        self._poll_t.append(now_s)
        got = [(s.replica_id, s.next_seq, 0) for s in reply.snapshots]
        got += [(b.replica_id, b.next_seq, _num_blocks(b)) for b in reply.batches if b.events]
        if reply.packed is not None:
            packed = reply.packed
            got += [(r, s, n) for r, s, n, e in zip(
                packed.replica_ids, packed.next_seqs(), packed.num_blocks_per_batch(),
                packed.num_events) if e]
        for replica_id, next_seq, num_blocks in got:
            k = replica_number(replica_id)
            for column, value in zip(self._rows, (k, next_seq, now_s)):
                column.append(value)
            if next_seq > self._max_seq.get(k, -1):
                self._max_seq[k] = next_seq
            self._num_blocks += num_blocks
        if got:
            self._last_s = now_s
        if len(self._max_seq) >= self._num_replicas_wanted:
            self._replicas_seen.set()


def _num_blocks(batch: EventBatch) -> int:
    return sum(len(getattr(e, "block_hashes", ())) for e in batch.events)
