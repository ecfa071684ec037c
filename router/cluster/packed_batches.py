"""Event batches as a few byte columns, for the Ray calls into and out of the KV index actor.

An `EventBatch` pickles as one object per event and one bytes object per block hash: about
150 ns a hash to dump and 80 to 130 to load, paid by the publisher, the actor, and again by
the actor and each router for every poll. At a million block events a second and 8 routers
that is two cores of pickling alone. `PackedBatches` carries any number of batches (of any
replicas) as columns, so a call pickles a handful of bytes objects whatever it carries:

    replica_ids, epochs, first_seqs, num_events    one entry a batch
    kinds, num_blocks                              one entry an event (uint8, uint32 LE)
    hashes                                         16 bytes a block, events in order

Only what the index uses travels: a stored event's parent hash and token ids do not (the
index actor and the routers never read them).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kv.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEvent
from kv.hashing import BlockHash

HASH_BYTES = 16
# an event's kind: stored / removed on the device / host, or every block cleared
_STORED_DEVICE, _STORED_HOST, _REMOVED_DEVICE, _REMOVED_HOST, _CLEARED = range(5)
_KIND_OF = {(BlockStored, "device"): _STORED_DEVICE, (BlockStored, "host"): _STORED_HOST,
            (BlockRemoved, "device"): _REMOVED_DEVICE, (BlockRemoved, "host"): _REMOVED_HOST}
_KINDS = frozenset(range(5))
_U32 = np.dtype("<u4")


@dataclass(frozen=True)
class PackedBatches:
    """Event batches as columns (see the module docstring); `pack` and `unpack` convert."""

    replica_ids: tuple[str, ...]
    epochs: tuple[str, ...]
    first_seqs: tuple[int, ...]
    num_events: tuple[int, ...]
    kinds: bytes
    num_blocks: bytes
    hashes: bytes

    def validate(self) -> None:
        """Raises ValueError unless the columns agree (for what arrives over a call; not in
        __post_init__: the actor packs a batch per publish and pays no check for its own)."""
        n = len(self.replica_ids)
        if not len(self.epochs) == len(self.first_seqs) == len(self.num_events) == n:
            raise ValueError("PackedBatches: one replica id, epoch, first_seq and event "
                             "count a batch")
        num_events = sum(self.num_events)
        if len(self.kinds) != num_events or len(self.num_blocks) != 4 * num_events:
            raise ValueError("PackedBatches: one kind and one block count an event")
        if len(self.hashes) != HASH_BYTES * self.num_blocks_total:
            raise ValueError("PackedBatches: 16 bytes a block")
        if not set(self.kinds) <= _KINDS:
            raise ValueError(f"PackedBatches: event kinds are {sorted(_KINDS)}")

    def __len__(self) -> int:
        return len(self.replica_ids)

    @property
    def num_blocks_total(self) -> int:
        return int(np.frombuffer(self.num_blocks, _U32).sum(dtype=np.int64))

    def next_seqs(self) -> list[int]:
        return [s + n for s, n in zip(self.first_seqs, self.num_events)]

    def num_blocks_per_batch(self) -> list[int]:
        """Blocks in each batch's events."""
        blocks_before = np.concatenate(([0], np.cumsum(np.frombuffer(self.num_blocks, _U32),
                                                       dtype=np.int64)))
        events_before = np.concatenate(([0], np.cumsum(self.num_events, dtype=np.int64)))
        return np.diff(blocks_before[events_before]).tolist()

    @classmethod
    def pack(cls, batches: Sequence[EventBatch]) -> PackedBatches:
        return join([pack_one(b) for b in batches])

    def unpack(self) -> list[EventBatch]:
        """The batches, with a bytes object a hash again (for code that takes events)."""
        hashes: list[BlockHash] = np.frombuffer(self.hashes, f"V{HASH_BYTES}").tolist()
        counts = np.frombuffer(self.num_blocks, _U32).tolist()
        out, e, h = [], 0, 0
        for replica_id, epoch, first_seq, num_events in zip(
                self.replica_ids, self.epochs, self.first_seqs, self.num_events):
            events: list[KVEvent] = []
            for kind, n in zip(self.kinds[e:e + num_events], counts[e:e + num_events]):
                block_hashes = tuple(hashes[h:h + n])
                h += n
                if kind == _CLEARED:
                    events.append(AllBlocksCleared())
                elif kind <= _STORED_HOST:
                    events.append(BlockStored(block_hashes, None,
                                              "device" if kind == _STORED_DEVICE else "host"))
                else:
                    events.append(BlockRemoved(block_hashes,
                                               "device" if kind == _REMOVED_DEVICE else "host"))
            e += num_events
            out.append(EventBatch(replica_id, epoch, first_seq, tuple(events)))
        return out


def pack_one(batch: EventBatch) -> PackedBatches:
    """One batch's columns (the index actor keeps these beside each logged batch, so that a
    poll's reply is a join, not a pack)."""
    kinds, counts, hashes = bytearray(), array("I"), []
    for event in batch.events:
        if isinstance(event, AllBlocksCleared):
            kinds.append(_CLEARED)
            counts.append(0)
            continue
        kinds.append(_KIND_OF[type(event), event.medium])
        counts.append(len(event.block_hashes))
        hashes.extend(event.block_hashes)
    return PackedBatches((batch.replica_id,), (batch.epoch,), (batch.first_seq,),
                         (len(batch.events),), bytes(kinds), _u32_bytes(counts),
                         b"".join(hashes))


def join(parts: Sequence[PackedBatches]) -> PackedBatches:
    """The batches of every part, in order, as one."""
    if len(parts) == 1:
        return parts[0]
    return PackedBatches(
        tuple(r for p in parts for r in p.replica_ids), tuple(e for p in parts for e in p.epochs),
        tuple(s for p in parts for s in p.first_seqs),
        tuple(n for p in parts for n in p.num_events), b"".join(p.kinds for p in parts),
        b"".join(p.num_blocks for p in parts), b"".join(p.hashes for p in parts))



def split(packed: PackedBatches) -> list[PackedBatches]:
    """Each batch's own columns (slices: the bytes are copied, so a part outlives the
    whole's buffer without keeping it)."""
    if len(packed) == 1:
        return [packed]
    out, e, h = [], 0, 0
    for k, (num_events, num_blocks) in enumerate(zip(packed.num_events,
                                                     packed.num_blocks_per_batch())):
        out.append(PackedBatches(
            packed.replica_ids[k:k + 1], packed.epochs[k:k + 1], packed.first_seqs[k:k + 1],
            (num_events,), packed.kinds[e:e + num_events],
            packed.num_blocks[4 * e:4 * (e + num_events)],
            packed.hashes[HASH_BYTES * h:HASH_BYTES * (h + num_blocks)]))
        e += num_events
        h += num_blocks
    return out


def _u32_bytes(values: array) -> bytes:
    return values.tobytes() if array("I").itemsize == 4 and np.little_endian else (
        np.asarray(values, dtype=np.int64).astype(_U32).tobytes())
