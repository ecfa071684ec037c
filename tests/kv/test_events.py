import random

from kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventLog,
    ReplicaSets,
)
from tests.kv.conftest import admit, hashes, make_manager


def drive(mgr, rng, steps):
    """Random admissions, cache fills and frees: produces a realistic event stream."""
    live = []
    for step in range(steps):
        if live and rng.random() < 0.4:
            mgr.free(live.pop(rng.randrange(len(live))))
            continue
        prefix = rng.choice([[1, 2, 3, 4] * 2, [5, 6, 7, 8] * 3, []])
        tokens = prefix + [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
        rid = f"q{step}"
        if admit(mgr, rid, tokens)[0] is not None:
            mgr.cache_blocks(rid, hashes(tokens), len(tokens))
            live.append(rid)


def truth(mgr):
    return {"device": set(mgr.pool.cached), "host": set(mgr.host.hashes())}


def test_consumer_with_gaps_reordering_and_snapshots_ends_with_pool_contents():
    rng = random.Random(7)
    mgr = make_manager(12, num_host_blocks=6)
    sets = ReplicaSets()
    tracker = sets.tracker
    tracker.apply_snapshot(mgr.snapshot())  # start in sync
    held = []
    num_snapshots = 0
    for _ in range(60):
        drive(mgr, rng, 5)
        mgr.take_copy_plan()
        batch = mgr.event_log.drain()
        fate = rng.random()
        if fate < 0.2:
            continue  # dropped
        if fate < 0.4:
            held.append(batch)  # delayed: delivered after a later one
            continue
        for b in [batch] + held[::-1]:
            if tracker.apply_batch(b).needs_snapshot:
                tracker.apply_snapshot(mgr.snapshot())
                num_snapshots += 1
        held = []
    final = mgr.event_log.drain()
    if tracker.apply_batch(final).needs_snapshot:
        tracker.apply_snapshot(mgr.snapshot())
    assert num_snapshots > 0
    assert sets.contents == truth(mgr)


def test_reordered_batches_apply_without_snapshot_when_nothing_is_lost():
    log = EventLog("r", epoch="e")
    sets = ReplicaSets()
    tracker = sets.tracker
    tracker.apply_snapshot(log.snapshot([]))
    log.append(BlockStored((b"a" * 16,), None))
    first = log.drain()
    log.append(BlockStored((b"b" * 16,), b"a" * 16))
    log.append(BlockRemoved((b"a" * 16,)))
    second = log.drain()
    assert tracker.apply_batch(second).needs_snapshot  # a gap, held
    assert tracker.apply_batch(first).applied == 3  # fills it, drains the held batch
    assert sets.contents["device"] == {b"b" * 16}
    assert tracker.apply_batch(first).applied == 0  # duplicates are ignored


def test_restart_gives_new_epoch_and_snapshot_replaces_contents():
    sets = ReplicaSets()
    tracker = sets.tracker
    log = EventLog("r", epoch="e1")
    tracker.apply_snapshot(log.snapshot([b"x" * 16]))
    restarted = EventLog("r", epoch="e2")
    restarted.append(BlockStored((b"y" * 16,), None))
    batch = restarted.drain()
    assert tracker.apply_batch(batch).needs_snapshot
    tracker.apply_snapshot(restarted.snapshot([b"y" * 16]))
    assert sets.contents["device"] == {b"y" * 16}
    restarted.append(AllBlocksCleared())
    assert not tracker.apply_batch(restarted.drain()).needs_snapshot
    assert sets.contents["device"] == set()


def test_overflowing_log_drops_oldest_and_consumer_resyncs():
    log = EventLog("r", epoch="e", max_buffered=2)
    sets = ReplicaSets()
    tracker = sets.tracker
    tracker.apply_snapshot(log.snapshot([]))
    for c in b"abc":
        log.append(BlockStored((bytes([c]) * 16,), None))
    batch = log.drain()
    assert batch == EventBatch("r", "e", 1, batch.events) and len(batch.events) == 2
    assert tracker.apply_batch(batch).needs_snapshot
