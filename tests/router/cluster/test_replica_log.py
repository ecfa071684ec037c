"""The index actor's per-replica log: ordered application, gap recovery, router deltas."""

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from kv.events import BlockRemoved, BlockStored, Cursor, EventLog, ReplicaSets, contents_digest
from router.cluster.replica_log import ReplicaLog


def h(i: int) -> bytes:
    return i.to_bytes(16, "little")


class Source:
    """A replica's true contents and its event log."""

    def __init__(self, replica_id: str = "r0"):
        self.log = EventLog(replica_id)
        self.device: set[bytes] = set()

    def store(self, *ids: int) -> None:
        new = tuple(h(i) for i in ids if h(i) not in self.device)
        if new:
            self.device.update(new)
            self.log.append(BlockStored(new, None))

    def remove(self, *ids: int) -> None:
        gone = tuple(h(i) for i in ids if h(i) in self.device)
        if gone:
            self.device.difference_update(gone)
            self.log.append(BlockRemoved(gone))

    def snapshot(self):
        return self.log.snapshot(self.device)


def test_in_order_batches_apply_and_serve_deltas():
    src, rep = Source(), ReplicaLog("r0")
    assert rep.publish(src.log.drain()) is True  # unknown epoch: snapshot first
    rep.apply_snapshot(src.snapshot())
    src.store(1, 2)
    first = src.log.drain()
    src.remove(1)
    src.store(3)
    second = src.log.drain()
    assert rep.publish(first) is False
    assert rep.publish(second) is False
    assert rep.contents["device"] == {h(2), h(3)}
    rep.check_invariants()
    # A cursor after the first batch gets exactly the second; an old epoch gets a snapshot.
    assert rep.delta_since(Cursor(first.epoch, first.next_seq)) == [second]
    assert rep.delta_since(Cursor("other-epoch", 0)) is None
    assert rep.delta_since(Cursor(first.epoch, second.next_seq + 5)) is None  # too new


def test_a_gap_asks_for_a_snapshot_and_a_reordered_batch_still_applies():
    src, rep = Source(), ReplicaLog("r0")
    rep.apply_snapshot(src.snapshot())
    src.store(1)
    b1 = src.log.drain()
    src.store(2)
    b2 = src.log.drain()
    assert rep.publish(b2) is True  # early: held, and a snapshot is asked for
    assert rep.contents["device"] == set()
    assert rep.publish(b1) is False  # the gap fills: both apply in order
    assert rep.contents["device"] == {h(1), h(2)}
    assert rep.next_seq == b2.next_seq
    rep.check_invariants()


def test_a_trimmed_log_sends_old_cursors_to_snapshots():
    src, rep = Source(), ReplicaLog("r0", max_logged_events=2)
    rep.apply_snapshot(src.snapshot())
    batches = []
    for i in range(4):
        src.store(i)
        batches.append(src.log.drain())
        rep.publish(batches[-1])
    assert rep.log_start_seq == 2
    assert rep.delta_since(Cursor(batches[0].epoch, 1)) is None
    assert rep.delta_since(Cursor(batches[0].epoch, 2)) == batches[2:]


def test_the_log_is_bounded_in_blocks_too():
    src, rep = Source(), ReplicaLog("r0", max_logged_blocks=10)
    rep.apply_snapshot(src.snapshot())
    batches = []
    for i in range(3):  # one event of 4 blocks each: 12 blocks in 3 events
        src.store(*range(4 * i, 4 * i + 4))
        batches.append(src.log.drain())
        rep.publish(batches[-1])
    rep.check_invariants()
    assert rep.log_start_seq == batches[1].first_seq  # the oldest 4 blocks left the log
    assert rep.delta_since(Cursor(batches[0].epoch, batches[0].first_seq)) is None
    assert rep.delta_since(Cursor(batches[0].epoch, batches[1].first_seq)) == batches[1:]
    assert rep.contents["device"] == src.device  # the contents are all there


class CountingDeque(deque):
    """A deque that counts the items its iterators hand out (either direction)."""

    num_visited = 0

    def __iter__(self):
        for item in super().__iter__():
            self.num_visited += 1
            yield item

    def __reversed__(self):
        for item in super().__reversed__():
            self.num_visited += 1
            yield item


def test_a_recent_cursor_gets_its_delta_without_walking_the_whole_log():
    # Every poll asks each replica's log for a delta: its cost must follow what is new,
    # not the log's length (a full log is 8,192 events, per replica, per poll).
    src, rep = Source(), ReplicaLog("r0")
    rep.apply_snapshot(src.snapshot())
    batches = []
    for i in range(500):
        src.store(i)
        src.store(1000 + i)
        batches.append(src.log.drain())
        rep.publish(batches[-1])
    rep._log = CountingDeque(rep._log)
    epoch = batches[0].epoch
    assert rep.delta_since(Cursor(epoch, batches[-2].next_seq)) == batches[-1:]
    mid = rep.delta_since(Cursor(epoch, batches[-2].first_seq + 1))  # inside a batch
    assert [b.first_seq for b in mid] == [batches[-2].first_seq + 1, batches[-1].first_seq]
    assert mid[0].events == batches[-2].events[1:] and mid[1] == batches[-1]
    assert rep.delta_since(Cursor(epoch, rep.next_seq)) == []
    assert rep._log.num_visited == 2 + 3 + 1  # each scan stops one batch past the cursor
    assert rep.delta_since(Cursor(epoch, batches[0].first_seq)) == batches


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["store", "remove", "batch", "restart"]),
                          st.lists(st.integers(0, 12), min_size=1, max_size=4)),
                min_size=1, max_size=40),
       st.lists(st.sampled_from(["deliver", "drop", "dup", "delay"]), min_size=1,
                max_size=40))
def test_converges_after_any_loss_reordering_and_restart(ops, fates):
    """The replica's contents reach the log and, through cursors, a consumer's ReplicaSets."""
    src, rep = Source(), ReplicaLog("r0", max_logged_events=16)
    consumer, cursor = ReplicaSets(), None
    delayed: list = []
    fate_i = 0

    def deliver(batch) -> None:
        if rep.publish(batch):
            rep.apply_snapshot(src.snapshot())  # the replica answers at once

    def sync_consumer() -> None:
        nonlocal cursor
        delta = rep.delta_since(cursor)
        tracker = consumer.tracker
        if delta is None:
            snap = rep.snapshot()
            if snap is None:
                return
            tracker.apply_snapshot(snap)
            cursor = Cursor(snap.epoch, snap.next_seq)
            return
        for batch in delta:
            assert not tracker.apply_batch(batch).needs_snapshot
            cursor = Cursor(batch.epoch, batch.next_seq)

    deliver(src.log.drain())  # the replica's first publish, at start-up
    for op, ids in ops:
        if op == "store":
            src.store(*ids)
        elif op == "remove":
            src.remove(*ids)
        elif op == "restart":  # same replica id, new epoch, empty cache
            src = Source()
        else:
            batch = src.log.drain()
            fate = fates[fate_i % len(fates)]
            fate_i += 1
            if fate == "deliver":
                deliver(batch)
                for held in delayed:
                    deliver(held)
                delayed.clear()
            elif fate == "dup":
                deliver(batch)
                deliver(batch)
            elif fate == "delay":
                delayed.append(batch)
            # "drop": lost on the way
            rep.check_invariants()
            sync_consumer()
    for held in delayed:
        deliver(held)
    deliver(src.log.drain())  # the next heartbeat
    rep.check_invariants()
    sync_consumer()
    assert rep.contents["device"] == src.device
    assert consumer.contents["device"] == src.device
    assert rep.digest() == contents_digest(src.device, set())
