"""Pinned-prefix records in the index actor's state (the plain class the actor wraps): a
record whose replica is forgotten is offered to one claimer at a time to warm again; a
restarted actor rebuilds the records from the pins the replicas report."""

import asyncio

from kv.events import Snapshot
from protocol.engine import PinnedPrefix
from router.cluster.index_actor import KVIndex
from router.cluster.prefix_registry import PrefixRecord


def record(name="support", replica="r1", tenant="t") -> PrefixRecord:
    return PrefixRecord(name, tenant, 64, 4, replica, tuple(range(64)))


async def test_a_forgotten_replicas_prefix_is_offered_once_then_placed_elsewhere():
    index = KVIndex()
    index.put_prefix(record())
    index.put_prefix(record("other", replica="r2"))
    assert await index.claim_orphaned_prefixes(wait_s=0.0) == []
    index.forget_replica("r1")
    (orphan,) = await index.claim_orphaned_prefixes(wait_s=5.0)
    assert orphan == PrefixRecord("support", "t", 64, 0, "", tuple(range(64)))
    assert await index.claim_orphaned_prefixes(wait_s=0.0) == []  # claimed already
    assert [r.replica_id for r in index.list_prefixes("t")] == ["r2", ""]
    assert index.place_prefix(orphan, record(replica="r2"))
    assert [(r.name, r.replica_id) for r in index.list_prefixes("t")] == [
        ("other", "r2"), ("support", "r2")]


async def test_a_prefix_deleted_while_being_warmed_is_not_placed():
    index = KVIndex()
    index.put_prefix(record())
    index.forget_replica("r1")
    (orphan,) = await index.claim_orphaned_prefixes(wait_s=5.0)
    assert index.pop_prefix("t", "support") == orphan
    assert not index.place_prefix(orphan, record(replica="r2"))  # the warmer unpins it
    assert index.list_prefixes("t") == []


async def test_a_released_or_expired_claim_is_offered_again():
    index = KVIndex()
    index.put_prefix(record())
    index.forget_replica("r1")
    (orphan,) = await index.claim_orphaned_prefixes(wait_s=5.0)
    index.release_claim(orphan)  # the warmer failed
    (again,) = await index.claim_orphaned_prefixes(wait_s=5.0, lease_s=0.05)
    assert again == orphan
    # The claimer died silently: once its lease runs out the record is offered again.
    (third,) = await asyncio.wait_for(index.claim_orphaned_prefixes(wait_s=30.0), 10.0)
    assert third == orphan


def snapshot_of(replica_id: str) -> Snapshot:
    return Snapshot(replica_id, "epoch-1", 0, frozenset(), frozenset())


def pin(name: str, salt: str = "t", blocks: int = 4) -> PinnedPrefix:
    return PinnedPrefix(name, salt, tuple(range(64)), blocks)


def test_a_restarted_actor_rebuilds_the_records_from_the_replicas_pins():
    index = KVIndex()  # the restarted actor: no records, no replicas
    index.publish_snapshot(snapshot_of("r1"), pinned=(pin("t/support"), pin("t/other", blocks=2),
                                                      pin("raw-engine-pin", salt="")))
    index.publish_snapshot(snapshot_of("r2"), pinned=(pin("u/support", salt="u"),))
    assert index.list_prefixes("t") == [PrefixRecord("other", "t", 64, 2, "r1", tuple(range(64))),
                                        record()]
    assert index.list_prefixes("u") == [record(replica="r2", tenant="u")]
    assert index.list_prefixes("") == []  # a pin not made through /v1/prefixes
    assert index.pop_prefix("t", "support") == record()  # deletable, as before the restart


def test_a_known_replicas_resync_and_an_existing_record_are_not_overridden():
    index = KVIndex()
    index.put_prefix(record(replica="r2"))  # re-pinned on r2 after r1 was lost
    index.publish_snapshot(snapshot_of("r1"), pinned=(pin("t/support"),))  # r1's stale pin
    assert [r.replica_id for r in index.list_prefixes("t")] == ["r2"]
    index.pop_prefix("t", "support")  # deleted; the unpin has not reached r1 yet
    index.publish_snapshot(snapshot_of("r1"), pinned=(pin("t/support"),))  # a later resync
    assert index.list_prefixes("t") == []
