"""bench_index_actor's replayed replicas and its lag join (no Ray)."""

import numpy as np

from benchmarks.bench_index_actor import lags_s
from benchmarks.simlib.event_shapes import REMOVE, STORE, ReplicaFeed, hash_ring
from router.cluster.replica_log import ReplicaLog

SHAPES = (((STORE, 3),), (), ((STORE, 2), (REMOVE, 4)), ((REMOVE, 50),))


def test_a_replayed_replica_is_followed_exactly_by_the_actor_log():
    ring = hash_ring(64)
    feed = ReplicaFeed("b3", SHAPES, ring, offset=60, held_blocks=5)  # wraps the ring
    log = ReplicaLog("b3")
    log.apply_snapshot(feed.snapshot())
    assert log.contents["device"] == {ring[i % 64] for i in range(60, 65)}
    sizes = []
    for num_shapes in (1, 1, 1, 2, 2):  # (2: a tick left its events for the next)
        batch = feed.next_batch(num_shapes)
        sizes.append([len(e.block_hashes) for e in batch.events])
        assert log.publish(batch) is False
    # 5 held; +3; nothing; +2 -4; -6 (all it holds, of 50) then +3; nothing then +2 -4
    assert sizes == [[3], [], [2, 4], [6, 3], [2, 4]]
    assert feed.end - feed.start == 1
    assert log.contents["device"] == {ring[feed.start % 64]}
    assert feed.num_blocks_sent == 3 + 2 + 4 + 6 + 3 + 2 + 4
    log.check_invariants()


def test_each_batch_lags_until_the_mirror_first_passes_its_sequence_number():
    published = {"replica": np.array([0, 0, 1, 1]), "next_seq": np.array([2, 5, 1, 4]),
                 "t": np.array([10.0, 11.0, 10.5, 12.0])}
    # replica 0 seen at seq 3 (covers the first batch) then 5; replica 1 only at seq 1
    received = {"replica": np.array([0, 1, 0]), "next_seq": np.array([3, 1, 5]),
                "t": np.array([10.25, 10.75, 11.5])}
    lag, missed = lags_s(published, received, end_s=20.0)
    assert lag.tolist() == [0.25, 0.5, 0.25, 8.0]
    assert missed == 1
