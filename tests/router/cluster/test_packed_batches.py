"""Event batches as columns: packed publishes and polls carry what EventBatch objects do."""

import pytest
from ray import cloudpickle

from kv.events import AllBlocksCleared, BlockRemoved, BlockStored, Cursor, EventBatch, EventLog
from protocol.engine import EngineStats
from router.cluster.index_actor import KVIndex, PollReply, PollRequest
from router.cluster.packed_batches import PackedBatches, join, pack_one, split


def h(i: int) -> bytes:
    return i.to_bytes(16, "little")


def mixed_batches() -> list[EventBatch]:
    a, b = EventLog("a", epoch="a-0"), EventLog("b", epoch="b-0")
    a.append(BlockStored((h(1), h(2)), None, "device"))
    a.append(BlockStored((h(3),), None, "host"))
    a.append(BlockRemoved((h(1),), "device"))
    first = a.drain()
    b.append(BlockRemoved((h(9),), "host"))
    b.append(AllBlocksCleared())
    b.append(BlockStored((), None))
    a.append(BlockStored((h(4),), None))
    return [first, b.drain(), a.drain()]


def test_columns_round_trip_every_event_kind():
    batches = mixed_batches()
    packed = PackedBatches.pack(batches)
    packed.validate()
    assert packed.unpack() == batches
    assert packed.replica_ids == ("a", "b", "a") and packed.num_blocks_total == 6
    assert packed.next_seqs() == [3, 3, 4] and packed.num_blocks_per_batch() == [4, 1, 1]
    assert [p.unpack() for p in split(packed)] == [[b] for b in batches]
    assert join(split(packed)) == packed
    assert join([pack_one(b) for b in batches]) == packed


def test_the_parent_hash_and_token_ids_do_not_travel():
    batch = EventBatch("a", "a-0", 0, (BlockStored((h(1),), h(0), "device", (5,) * 16),))
    assert PackedBatches.pack([batch]).unpack() == [
        EventBatch("a", "a-0", 0, (BlockStored((h(1),), None, "device"),))]


@pytest.mark.parametrize("broken", [
    {"epochs": ()},  # one epoch short
    {"kinds": b"\x00"},  # kinds of fewer events than counted
    {"kinds": b"\x00\x01\x07"},  # no such kind
    {"hashes": b"\x00" * 15},  # hashes not 16 bytes a block
])
def test_columns_that_disagree_are_refused(broken):
    packed = PackedBatches.pack(mixed_batches()[:1])
    fields = {**packed.__dict__, **broken}
    with pytest.raises(ValueError):
        PackedBatches(**fields).validate()


async def test_a_packed_publish_and_a_packed_poll_carry_what_batches_do():
    index = KVIndex()
    first, second, third = mixed_batches()
    for log in (EventLog("a", epoch="a-0"), EventLog("b", epoch="b-0")):
        index.publish_snapshot(log.snapshot(()))
    # a relay's call: both replicas' batches, the third continues the first's replica
    assert index.publish_packed(PackedBatches.pack([first, second, third]), {}) == ()
    index.check_invariants()
    start = {"a": Cursor("a-0", 0), "b": Cursor("b-0", 0)}
    plain = await index.poll(PollRequest("r1", start))
    packed = await index.poll(PollRequest("r2", start, packed=True))
    assert plain.batches == (first, third, second)  # by replica, each in order
    assert packed.batches == () and packed.packed.unpack() == list(plain.batches)
    # from inside a batch: the log's columns are cut at the cursor, like its batches
    mid = {"a": Cursor("a-0", 1)}
    assert (await index.poll(PollRequest("r2", mid, packed=True))).packed.unpack() == list(
        (await index.poll(PollRequest("r1", mid))).batches)
    # a gap asks that replica for a snapshot and keeps the batch for when it connects
    late = EventBatch("b", "b-0", 5, (BlockStored((h(7),), None),))
    assert index.publish_packed(PackedBatches.pack([late]), {}) == ("b",)


async def test_polls_and_replies_pickle_to_equals_with_cursors_and_stats_as_columns():
    index = KVIndex()
    log = EventLog("a", epoch="a-0")
    stats = EngineStats(1, 2, 3, 64, 10, 5, 0, 49, 0, 0)
    index.publish_snapshot(log.snapshot((h(1),)), stats)
    request = PollRequest("r1", {"a": Cursor("a-0", 0), "gone": Cursor("g-0", 7)}, 0.5,
                          packed=True)
    assert cloudpickle.loads(cloudpickle.dumps(request)) == request  # as Ray pickles calls
    reply = await index.poll(request)
    assert reply.stats == {"a": stats} and reply.removed_replica_ids == ("gone",)
    assert cloudpickle.loads(cloudpickle.dumps(reply)) == reply
    bare = PollReply((), (), {"a": stats}, ())  # built elsewhere: values made when pickled
    assert cloudpickle.loads(cloudpickle.dumps(bare)).stats == {"a": stats}
