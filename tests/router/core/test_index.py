import random

import pytest

from kv.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, EventLog
from kv.manager import KVCacheConfig, KVCacheManager
from router.core.index import PrefixIndex, PrefixMatch
from tests.router.core.core_helpers import BLOCK_SIZE, FakeClock, chain, h


def synced(index: PrefixIndex, replica_id: str, device=(), host=()) -> EventLog:
    """A replica in sync with `index`, holding the given hashes; returns its event log."""
    log = EventLog(replica_id, epoch="e0")
    assert index.apply_batch(log.drain())  # never heard of: asks for a snapshot
    index.apply_snapshot(log.snapshot(device, host))
    return log


def test_longest_prefix_per_replica_device_then_host_run():
    index = PrefixIndex()
    prompt = [h(i) for i in range(6)]
    synced(index, "r0", device=prompt[:3])
    synced(index, "r1", device=prompt[:1], host=prompt[1:4])
    synced(index, "r2", device=[h(100)])
    synced(index, "r3", host=prompt[:2])
    # engine semantics: device run, then host run; a device block after the host run ends it
    synced(index, "r4", device=[prompt[0], prompt[2], prompt[3]], host=[prompt[1]])
    synced(index, "r5", device=prompt)
    index.check_invariants()
    got = index.match(prompt, ["r0", "r1", "r2", "r3", "r4", "r5", "unknown"])
    assert got == {
        "r0": PrefixMatch(3, 0),
        "r1": PrefixMatch(1, 3),
        "r3": PrefixMatch(0, 2),
        "r4": PrefixMatch(1, 1),
        "r5": PrefixMatch(6, 0),
    }
    assert index.match(prompt, ["r1", "r2"]) == {"r1": PrefixMatch(1, 3)}  # candidates only
    assert index.match([h(100)] + prompt, ["r0", "r2"]) == {"r2": PrefixMatch(1, 0)}
    assert index.match([], ["r0"]) == {}


def test_hit_tokens_are_capped_at_the_prompt():
    assert PrefixMatch(2, 3).hit_tokens(16, 1000) == (32, 48)
    assert PrefixMatch(2, 3).hit_tokens(16, 40) == (32, 8)
    assert PrefixMatch(4, 0).hit_tokens(16, 40) == (40, 0)


def test_events_update_masks_and_removal_of_unknown_hash_is_harmless():
    index = PrefixIndex()
    log = synced(index, "r0")
    synced(index, "r1", device=[h(1)])
    log.append(BlockStored((h(1), h(2)), None))
    log.append(BlockRemoved((h(7),)))  # never stored: nothing to do
    log.append(BlockStored((h(3),), h(2), "host"))
    assert not index.apply_batch(log.drain())
    assert index.holders(h(1)) == {"r0", "r1"}
    assert index.holders(h(3), "host") == {"r0"}
    log.append(BlockRemoved((h(1),)))
    log.append(AllBlocksCleared())
    log.append(BlockStored((h(5),), None))
    assert not index.apply_batch(log.drain())
    assert index.holders(h(1)) == {"r1"}
    assert index.blocks_of("r0") == {h(5)} and index.blocks_of("r0", "host") == set()
    assert (index.num_blocks("device"), index.num_blocks("host")) == (2, 0)
    index.check_invariants()


def test_pending_marks_count_as_device_expire_and_are_confirmed_by_events():
    clock = FakeClock()
    index = PrefixIndex(pending_ttl_s=2.0, clock=clock)
    prompt = [h(i) for i in range(4)]
    index.mark_pending("fresh", prompt)  # a replica with no events yet
    assert index.match(prompt, ["fresh"]) == {"fresh": PrefixMatch(4, 0)}
    assert index.apply_batch(EventBatch("fresh", "e0", 0, ()))  # not synced: snapshot first
    clock.advance(1.0)
    index.mark_pending("fresh", prompt[:2])  # refreshed: these live until t = 3
    clock.advance(1.0)  # t = 2: the first marks expire, the refreshed ones stay
    assert index.match(prompt, ["fresh"]) == {"fresh": PrefixMatch(2, 0)}
    index.check_invariants()
    log = EventLog("fresh", epoch="e")
    index.apply_snapshot(log.snapshot([]))
    log.append(BlockStored((prompt[0],), None))
    index.apply_batch(log.drain())  # confirms block 0's mark; block 1 stays pending
    assert len(index.pending) == 1
    assert index.match(prompt, ["fresh"]) == {"fresh": PrefixMatch(2, 0)}
    clock.advance(1.0)
    assert index.match(prompt, ["fresh"]) == {"fresh": PrefixMatch(1, 0)}
    assert len(index.pending) == 0
    index.check_invariants()


def test_remove_replica_forgets_everything_and_its_slot_is_reused_clean():
    index = PrefixIndex()
    synced(index, "r0", device=[h(1), h(2)], host=[h(3)])
    synced(index, "r1", device=[h(1)])
    index.mark_pending("r0", [h(9)])
    index.remove_replica("r0")
    index.check_invariants()
    assert index.replica_ids == ["r1"]
    assert index.holders(h(1)) == {"r1"}
    assert (index.num_blocks("device"), index.num_blocks("host")) == (1, 0)
    assert len(index.pending) == 0
    synced(index, "r2")  # takes r0's slot: none of r0's bits may come back
    assert index.slot_of("r2") == 0
    assert index.match([h(1), h(2)], ["r1", "r2"]) == {"r1": PrefixMatch(1, 0)}
    assert index.match([h(9)], ["r2"]) == {}
    # r0 comes back: unknown again, so its first batch asks for a snapshot
    assert index.apply_batch(EventLog("r0", epoch="e0").drain())
    index.check_invariants()


def test_check_invariants_catches_a_corrupt_mask():
    index = PrefixIndex()
    synced(index, "r0", device=[h(1)])
    row = index._table.lookup_one(h(1))
    index._table.masks[row, 0] = 0b11
    with pytest.raises(AssertionError, match="bitmasks"):
        index.check_invariants()
    index._table.masks[row, 0] = 0
    with pytest.raises(AssertionError, match="empty"):
        index.check_invariants()


def _drive(mgr: KVCacheManager, rng: random.Random, live: list[str], step: int) -> None:
    """One random admission (with shared prefixes) or free: the real producer of events."""
    if live and rng.random() < 0.45:
        mgr.free(live.pop(rng.randrange(len(live))))
        return
    prefix = rng.choice([[1, 2, 3, 4] * 2, [5, 6, 7, 8] * 3, [9] * 4, []])
    tokens = prefix + [rng.randrange(40) for _ in range(rng.randrange(1, 10))]
    hashes = chain(tokens)
    rid = f"q{step}"
    match = mgr.match(hashes)
    if mgr.allocate(rid, len(tokens), hashes, match) is not None:
        mgr.cache_blocks(rid, hashes, len(tokens))
        live.append(rid)
    mgr.take_copy_plan()


def test_index_converges_to_managers_after_drops_reorders_and_restarts():
    rng = random.Random(3)
    index = PrefixIndex()
    replica_ids = ["r0", "r1", "r2"]
    cfg = KVCacheConfig(num_blocks=14, block_size=BLOCK_SIZE, num_host_blocks=6)
    mgrs = {r: KVCacheManager(cfg, EventLog(r, epoch=f"{r}-0")) for r in replica_ids}
    live: dict[str, list[str]] = {r: [] for r in replica_ids}
    held: list = []
    num_snapshots = num_restarts = 0
    for step in range(300):
        r = rng.choice(replica_ids)
        if rng.random() < 0.02:  # restart: new epoch, empty cache
            mgrs[r] = KVCacheManager(cfg, EventLog(r, epoch=f"{r}-{step}"))
            live[r] = []
            num_restarts += 1
        _drive(mgrs[r], rng, live[r], step)
        if rng.random() < 0.3:
            continue  # events accumulate in the log
        batch = mgrs[r].event_log.drain()
        fate = rng.random()
        if fate < 0.15:
            continue  # dropped
        if fate < 0.35:
            held.append(batch)  # delayed: delivered after later batches
            continue
        for b in [batch] + (held[::-1] if rng.random() < 0.5 else []):
            if index.apply_batch(b):
                index.apply_snapshot(mgrs[b.replica_id].snapshot())
                num_snapshots += 1
            if b is not batch:
                held.remove(b)
        index.check_invariants()
    for r in replica_ids:  # quiesce: deliver what is left, resync where needed
        if index.apply_batch(mgrs[r].event_log.drain()):
            index.apply_snapshot(mgrs[r].snapshot())
    for b in held:  # stale batches arriving late change nothing
        index.apply_batch(b)
    index.check_invariants()
    assert num_snapshots > 3 and num_restarts > 0
    for r in replica_ids:
        assert index.blocks_of(r, "device") == set(mgrs[r].pool.cached), r
        assert index.blocks_of(r, "host") == set(mgrs[r].host.hashes()), r
        prompt = chain([1, 2, 3, 4] * 2, [0] * 4)
        want = mgrs[r].match(prompt)
        got = index.match(prompt, [r]).get(r, PrefixMatch(0, 0))
        assert got == (want.num_device_blocks, want.num_host_blocks)


def test_repeated_hashes_in_one_event_count_once():
    index = PrefixIndex()
    log = synced(index, "r0")
    log.append(BlockStored((h(1), h(1), h(2)), None))
    log.append(BlockStored((h(2), h(3), h(3)), None, "host"))
    assert not index.apply_batch(log.drain())
    assert (index.num_blocks("device"), index.num_blocks("host")) == (2, 2)
    index.check_invariants()


def test_a_batch_storing_a_pending_block_twice_confirms_its_mark_once():
    index = PrefixIndex()
    log = synced(index, "r0")
    index.mark_pending("r0", [h(1), h(2)], held=True)
    log.append(BlockStored((h(1),), None))
    log.append(BlockStored((h(1), h(3)), None))
    assert not index.apply_batch(log.drain())
    assert index.pending_blocks("r0") == frozenset({h(2)})
    assert index.match([h(1), h(2), h(3)], ["r0"]) == {"r0": PrefixMatch(3, 0)}  # h(2) pending
    index.check_invariants()
