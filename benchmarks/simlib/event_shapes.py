"""KV event batches shaped like the simulator's, replayed by any number of replicas.

`capture_shapes` runs the cluster simulator (the real engine's KV manager and event log)
and keeps, per simulated replica, the shape of every batch its publisher drained: each
event's kind (store or remove) and number of blocks, from the first eviction on (the
steady state: a full cache stores about as many blocks as it evicts).

`ReplicaFeed` replays one such sequence as one replica with Protocol 2 semantics: stores
take fresh hashes, removes take the oldest held ones (only blocks it holds), sequence
numbers are contiguous. Hashes are slices of one shared ring of 16-byte values, so making
a batch allocates no hash objects (replicas offset into the ring: their hashes overlap the
way a shared prefix does, which the per-replica index does not care about).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import xxhash

from benchmarks.simlib import experiment as ex
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim
from benchmarks.simlib.replica import ReplicaConfig
from kv.events import BlockRemoved, BlockStored, EventBatch, Snapshot
from protocol.engine import EngineStats
from router.core.router import RouterConfig

STORE, REMOVE = 0, 1
BatchShape = tuple[tuple[int, int], ...]  # per event: (STORE | REMOVE, num_blocks)


@dataclass(frozen=True)
class Shapes:
    """What the simulated replicas published, every publish_interval_s while busy."""

    workload: str
    publish_interval_s: float
    per_replica: tuple[tuple[BatchShape, ...], ...]  # [replica][publish] -> shape

    @property
    def num_batches(self) -> int:
        return sum(len(p) for p in self.per_replica)

    @property
    def num_blocks(self) -> int:
        return sum(n for p in self.per_replica for shape in p for _, n in shape)

    def blocks_per_s_per_replica(self) -> float:
        """Block events a busy replica sends a second (stores + removes)."""
        return self.num_blocks / (self.num_batches * self.publish_interval_s)

    def summary(self) -> dict:
        sizes = sorted(sum(n for _, n in s) for p in self.per_replica for s in p)
        events = sum(len(s) for p in self.per_replica for s in p)
        stored = sum(n for p in self.per_replica for s in p for k, n in s if k == STORE)
        return {"workload": self.workload, "num_batches": self.num_batches,
                "blocks_per_batch_mean": round(self.num_blocks / self.num_batches, 1),
                "blocks_per_batch_p50": sizes[len(sizes) // 2],
                "blocks_per_batch_p99": sizes[int(0.99 * (len(sizes) - 1))],
                "events_per_batch": round(events / self.num_batches, 2),
                "stored_share": round(stored / self.num_blocks, 3),
                "blocks_per_s_per_replica": round(self.blocks_per_s_per_replica(), 1)}


def capture_shapes(workload: str = "mooncake", rate_per_replica: float = 2.0,
                   num_replicas: int = 8, arrivals_s: float = 90.0) -> Shapes:
    """Runs `workload` for its arrivals in the first `arrivals_s` seconds (until they all
    finish) and returns the shapes published from the cluster's first eviction on."""
    d = ex.DEFAULTS[workload]
    full = ex.build_workload(workload, rate_per_replica, num_replicas)
    first = min(it.arrival_s for it in full.items)
    items = tuple(it for it in full.items if it.arrival_s < first + arrivals_s)
    kept = {it.request_id for it in items}
    items = tuple(it for it in items if it.parent_id is None or it.parent_id in kept)
    config = ClusterConfig(num_replicas, ReplicaConfig(num_blocks=d.num_blocks), RouterConfig())
    sim = ClusterSim(config, dataclasses.replace(full, items=items))
    published: list[list[tuple[float, BatchShape]]] = [[] for _ in sim.replicas]
    for i, rep in enumerate(sim.replicas):
        rep.core.drain_events = _recording(rep.core.drain_events, sim, published[i])
    sim.run()
    evictions = [t for p in published for t, s in p if any(k == REMOVE for k, _ in s)]
    if not evictions:
        raise ValueError(f"{workload}: no replica evicted in {arrivals_s} s; capture longer")
    steady_s = min(evictions)
    per_replica = tuple(tuple(s for t, s in p if t >= steady_s) for p in published)
    return Shapes(workload, config.publish_interval_s, tuple(p for p in per_replica if p))


def _recording(drain, sim: ClusterSim, out: list[tuple[float, BatchShape]]):
    def drain_and_record() -> EventBatch:
        batch = drain()
        out.append((sim.now, tuple(
            (STORE if isinstance(e, BlockStored) else REMOVE, len(e.block_hashes))
            for e in batch.events if isinstance(e, BlockStored | BlockRemoved))))
        return batch
    return drain_and_record


class ReplicaFeed:
    """One replayed replica: its next batch each publish, over a shared ring of hashes.

    Holds ring[start:end] (mod the ring's size): a store appends at `end`, a remove takes
    from `start`, so contents stay exact without a set here.
    """

    def __init__(self, replica_id: str, shapes: tuple[BatchShape, ...], ring: list[bytes],
                 offset: int, held_blocks: int, start_batch: int = 0):
        if not 0 < held_blocks < len(ring) // 2:
            raise ValueError(f"held_blocks must be in (0, {len(ring) // 2}), got {held_blocks}")
        self.replica_id = replica_id
        self.epoch = f"{replica_id}-epoch"
        self._shapes = shapes
        self._ring = ring
        self._next_batch = start_batch % len(shapes)
        self.start = offset  # ring position of the oldest held block (unwrapped)
        self.end = offset + held_blocks
        self.next_seq = 0
        self.num_blocks_sent = 0

    def snapshot(self) -> Snapshot:
        return Snapshot(self.replica_id, self.epoch, self.next_seq,
                        frozenset(self._take(self.start, self.end)))

    def stats(self) -> EngineStats:
        held = self.end - self.start
        return EngineStats(num_running=8, num_waiting=self.next_seq % 4,
                           num_queued_prefill_tokens=16 * (self.next_seq % 64),
                           num_blocks=2 * held + 1024, num_used_blocks=held,
                           num_cached_blocks=0, num_pinned_blocks=0,
                           num_free_blocks=held + 1024, num_host_blocks=0,
                           num_host_cached_blocks=0)

    def owed_blocks(self, num_shapes: int) -> int:
        """Blocks in the next `num_shapes` shapes (what a batch of them would carry, at
        most)."""
        size = len(self._shapes)
        return sum(n for i in range(num_shapes)
                   for _, n in self._shapes[(self._next_batch + i) % size])

    def next_batch(self, num_shapes: int = 1) -> EventBatch:
        """The events of the next `num_shapes` publishes, in one batch (a publisher that
        skipped ticks sends what accumulated)."""
        size = len(self._shapes)
        shape = tuple(ev for i in range(num_shapes)
                      for ev in self._shapes[(self._next_batch + i) % size])
        self._next_batch = (self._next_batch + num_shapes) % size
        events: list[BlockStored | BlockRemoved] = []
        limit = len(self._ring) // 2  # held never wraps onto itself
        for kind, n in shape:
            if kind == STORE:
                n = min(n, limit - (self.end - self.start))
                if n:
                    events.append(BlockStored(self._take(self.end, self.end + n), None))
                    self.end += n
            else:
                n = min(n, self.end - self.start)
                if n:
                    events.append(BlockRemoved(self._take(self.start, self.start + n)))
                    self.start += n
            self.num_blocks_sent += n
        batch = EventBatch(self.replica_id, self.epoch, self.next_seq, tuple(events))
        self.next_seq = batch.next_seq
        return batch

    def _take(self, lo: int, hi: int) -> tuple[bytes, ...]:
        size = len(self._ring)
        lo_mod, hi_mod = lo % size, hi % size
        if hi - lo <= size - lo_mod:
            return tuple(self._ring[lo_mod:lo_mod + hi - lo])
        return tuple(self._ring[lo_mod:]) + tuple(self._ring[:hi_mod])


def hash_ring(num_hashes: int) -> list[bytes]:
    """`num_hashes` distinct 16-byte values that look like xxh3 digests (the index compares
    a digest's second word first: counting integers, all zero there, made every lookup
    take its slow path)."""
    return [xxhash.xxh3_128_digest(i.to_bytes(8, "little")) for i in range(num_hashes)]
