from kv.block_pool import BlockPool
from kv.events import BlockRemoved, BlockStored, EventLog
from kv.hashing import block_hashes, namespace_root

H = block_hashes(list(range(16 * 6)), 16, namespace_root("m"))


def test_free_queue_is_lru_with_removal_from_the_middle():
    pool = BlockPool(5)
    assert pool.free_queue.block_ids() == [0, 1, 2, 3, 4]
    got = pool.take_new_blocks(3)
    assert [b.block_id for b in got] == [0, 1, 2]
    assert pool.free_queue.block_ids() == [3, 4]
    pool.release([got[2], got[0]])
    assert pool.free_queue.block_ids() == [3, 4, 2, 0]
    pool.touch([pool.blocks[4]])  # removal from the middle
    assert pool.free_queue.block_ids() == [3, 2, 0]
    assert pool.take_new_blocks(4) is None
    assert pool.free_queue.block_ids() == [3, 2, 0]
    pool.check_invariants()


def test_freed_cached_block_keeps_hash_and_is_revived_by_a_hit():
    log = EventLog("r0", epoch="e")
    pool = BlockPool(3, log)
    a, b = pool.take_new_blocks(2)
    assert pool.cache_blocks([a, b], H[:2], None) == 2
    pool.release([b, a])
    assert pool.num_cached_free_blocks == 2
    assert pool.lookup(H[0]) is a and a.block_hash == H[0]
    pool.touch([a])  # revive
    assert a.ref_cnt == 1 and pool.free_queue.block_ids() == [2, 1]
    # The next allocation takes the uncached block 2 first, then evicts b (LRU head).
    (c,) = pool.take_new_blocks(1)
    assert c.block_id == 2 and pool.lookup(H[1]) is b
    (d,) = pool.take_new_blocks(1)
    assert d is b and b.block_hash is None and pool.lookup(H[1]) is None
    events = log.drain().events
    assert events == (BlockStored((H[0], H[1]), None, "device"),
                      BlockRemoved((H[1],), "device"))
    assert pool.num_evictions == 1
    pool.check_invariants()


def test_duplicate_hash_stays_uncached_and_event_runs_keep_parents():
    log = EventLog("r0", epoch="e")
    pool = BlockPool(6, log)
    first = pool.take_new_blocks(1)
    pool.cache_blocks(first, [H[1]], H[0])
    log.drain()
    blocks = pool.take_new_blocks(3)
    assert pool.cache_blocks(blocks, H[:3], None) == 2
    assert blocks[1].block_hash is None and pool.lookup(H[1]) is first[0]
    assert log.drain().events == (BlockStored((H[0],), None, "device"),
                                  BlockStored((H[2],), H[1], "device"))
    pool.check_invariants()
