"""The bounds on a worker's KV event stream: the block budget, the pieces the index gets,
and the decoder's per-event cap."""

import time

import pytest

from kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from protocol.vllm import wire
from router.cluster.event_bounds import BlockBudget, pieces


class Clock:
    def __init__(self):
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_the_budget_pays_bursts_up_to_its_capacity_then_its_rate():
    clock = Clock()
    budget = BlockBudget(rate_per_s=100.0, capacity=1000, clock=clock)
    assert budget.take(1000)
    assert not budget.take(1)  # empty: nothing is spent by a refusal
    clock.now_s = 0.5
    assert not budget.take(51) and budget.take(50)
    clock.now_s = 3600.0  # refills to the capacity, not beyond
    assert not budget.take(1001) and budget.take(1000)


def test_pieces_split_events_by_blocks_and_keep_every_chain():
    store = BlockStored(tuple(bytes([i]) for i in range(10)), b"p", "device",
                        tuple(range(20)))  # 2 tokens a block
    events = [store, AllBlocksCleared(), BlockRemoved((b"x", b"y", b"z"), "host")]
    out = pieces(events, 4)
    assert [sum(len(getattr(e, "block_hashes", ())) for e in p) for p in out] == [4, 4, 4, 1]
    flat = [e for p in out for e in p]
    stores = [e for e in flat if isinstance(e, BlockStored)]
    assert [s.block_hashes for s in stores] == [store.block_hashes[0:4],
                                               store.block_hashes[4:8],
                                               store.block_hashes[8:10]]
    assert [s.parent_hash for s in stores] == [b"p", bytes([3]), bytes([7])]
    assert [s.token_ids for s in stores] == [tuple(range(0, 8)), tuple(range(8, 16)),
                                            tuple(range(16, 20))]
    assert flat[3] == AllBlocksCleared()
    assert [e.block_hashes for e in flat[4:]] == [(b"x", b"y"), (b"z",)]
    assert pieces([store], 100) == [[store]]  # small: unchanged


def big_event_payload(num_blocks: int) -> bytes:
    event = wire.BlockStored(block_hashes=list(range(num_blocks)), parent_block_hash=None,
                             token_ids=[1] * (16 * num_blocks), block_size=16, lora_id=None,
                             medium="GPU", lora_name=None)
    return wire.encode_batch(wire.KVEventBatch(time.time(), [event, wire.AllBlocksCleared()]))


def test_an_event_over_the_cap_is_refused_before_it_is_decoded():
    payload = big_event_payload(1000)
    decoded = wire.decode_batch(payload)
    assert wire.num_blocks(decoded.batch) == 1000
    with pytest.raises(wire.EventTooLarge, match="more than 1024"):
        wire.decode_batch(payload, max_event_bytes=1024)
    assert wire.num_blocks(wire.decode_batch(payload, max_event_bytes=len(payload)).batch) == 1000


def test_a_batch_time_is_read_without_its_events():
    payload = big_event_payload(1000)
    assert wire.batch_ts(payload) == wire.decode_batch(payload).batch.ts
    with pytest.raises(wire.WireFormatError):
        wire.batch_ts(b"\x93garbage")
