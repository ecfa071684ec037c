"""A poll finds the replicas a router lags behind from the actor's kept positions (not by
visiting every replica): replies bring exactly those, whatever happened in between."""

import random

from ray import cloudpickle

from kv.events import BlockRemoved, BlockStored, Cursor, EventLog
from protocol.engine import EngineStats
from router.cluster.index_actor import KVIndex, PollRequest
from router.cluster.packed_batches import PackedBatches
from router.cluster.poll_messages import CursorColumns, values_of


def h(i: int) -> bytes:
    return i.to_bytes(16, "little")


def stats_of(k: int) -> EngineStats:
    return EngineStats(k % 3, k % 5, 16 * k, 64, 10, 5, 0, 49, 0, 0)


def test_request_cursors_arrive_as_columns_and_read_as_cursors():
    request = PollRequest("r1", {"a": Cursor("a-0", 3), "b": Cursor("b-1", 0)}, packed=True)
    arrived = cloudpickle.loads(cloudpickle.dumps(request))
    assert isinstance(arrived.cursors, CursorColumns)
    assert arrived.cursors.positions == {"a": ("a-0", 3), "b": ("b-1", 0)}
    assert arrived.cursors["a"] == Cursor("a-0", 3) and arrived.cursors.get("c") is None
    assert dict(arrived.cursors) == request.cursors and arrived == request
    assert cloudpickle.loads(cloudpickle.dumps(arrived)) == request  # and pickles again


async def test_replies_carry_each_replicas_stats_values_made_at_publish():
    index = KVIndex()
    index.publish_snapshot(EventLog("a", epoch="a-0").snapshot((h(1),)), stats_of(1))
    index.publish_snapshot(EventLog("b", epoch="b-0").snapshot(()), stats_of(2))
    reply = await index.poll(PollRequest("r1", {}))
    assert reply.stats == {"a": stats_of(1), "b": stats_of(2)}
    assert reply.stats_values == (values_of(stats_of(1)), values_of(stats_of(2)))
    index.forget_replica("a")
    reply = await index.poll(PollRequest("r1", {}))
    assert reply.stats == {"b": stats_of(2)} and reply.stats_values == (values_of(stats_of(2)),)
    index.check_invariants()


async def test_random_histories_each_poll_brings_exactly_the_replicas_behind():
    rng = random.Random(7)
    index = KVIndex()
    logs: dict[str, EventLog] = {}
    held: dict[str, list[bytes]] = {}
    epochs = 0
    routers: dict[str, dict[str, Cursor]] = {"r0": {}, "r1": {}, "r2": {}}
    next_hash = 0
    for step in range(600):
        action = rng.random()
        rid = f"rep{rng.randrange(6)}"
        if rid not in logs or action < 0.05:  # a new replica, or one restarted: new epoch
            epochs += 1
            logs[rid], held[rid] = EventLog(rid, epoch=f"{rid}-{epochs}"), []
            index.publish_snapshot(logs[rid].snapshot(()), stats_of(step))
        elif action < 0.08:  # it leaves
            index.forget_replica(rid)
            del logs[rid], held[rid]
        elif action < 0.75:  # it publishes events, packed (a relay) or as a batch
            log = logs[rid]
            for _ in range(rng.randrange(3)):
                if held[rid] and rng.random() < 0.4:
                    gone = held[rid][:rng.randrange(1, len(held[rid]) + 1)]
                    del held[rid][:len(gone)]
                    log.append(BlockRemoved(tuple(gone)))
                else:
                    new = [h(next_hash + i) for i in range(rng.randrange(1, 4))]
                    next_hash += len(new)
                    held[rid] += new
                    log.append(BlockStored(tuple(new), None))
            batch = log.drain()
            if rng.random() < 0.05:
                continue  # lost on the way: the next batch leaves a gap, and a snapshot
            stale = (index.publish_packed(PackedBatches.pack([batch]), {rid: stats_of(step)})
                     if rng.random() < 0.5 else
                     (rid,) if index.publish(batch, stats_of(step)) else ())
            if stale:
                index.publish_snapshot(log.snapshot(held[rid]), stats_of(step))
        else:  # a router polls, its cursors as they arrive over Ray, some moved by hand
            router_id = rng.choice(sorted(routers))
            cursors = routers[router_id]
            if cursors and rng.random() < 0.2:
                rid = rng.choice(sorted(cursors))
                cursors[rid] = Cursor(rng.choice([cursors[rid].epoch, "other"]),
                                      max(0, cursors[rid].next_seq - rng.randrange(3)))
            if rng.random() < 0.1:
                cursors["never-was"] = Cursor("x", 0)
            request = cloudpickle.loads(cloudpickle.dumps(
                PollRequest(router_id, dict(cursors), packed=rng.random() < 0.5)))
            actor_logs = [(r, index._replicas[r].log) for r in logs]  # as the actor has them
            positions = {r: (log.epoch, log.next_seq) for r, log in actor_logs if log.synced}
            reply = await index.poll(request)
            got = [s.replica_id for s in reply.snapshots] + [b.replica_id for b in (
                reply.packed.unpack() if reply.packed else reply.batches)]
            behind = {r for r, pos in positions.items()
                      if r not in cursors or (cursors[r].epoch, cursors[r].next_seq) != pos}
            assert set(got) == behind
            assert set(reply.removed_replica_ids) == set(cursors) - set(index._replicas)
            for snap in reply.snapshots:
                cursors[snap.replica_id] = Cursor(snap.epoch, snap.next_seq)
            for batch in (reply.packed.unpack() if reply.packed else reply.batches):
                cursors[batch.replica_id] = Cursor(batch.epoch, batch.next_seq)
            for r in reply.removed_replica_ids:
                del cursors[r]
            # what the reply brought takes the router to every synced replica's position
            assert {r: (c.epoch, c.next_seq) for r, c in cursors.items()
                    if r in positions} == positions
        index.check_invariants()
