import random

import pytest

from kv.block_pool import Block, BlockPool, FreeBlockQueue
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


def test_a_run_evicts_its_cached_blocks_in_lru_order_hook_first():
    log = EventLog("r0", epoch="e")
    seen = []
    pool = BlockPool(6, log, on_evict=lambda b: seen.append(
        (b.block_id, b.block_hash, pool.lookup(b.block_hash) is b)))
    blocks = pool.take_new_blocks(4)
    pool.cache_blocks(blocks[:3], H[:3], None)
    log.drain()
    pool.release(reversed(blocks))  # tail first
    assert pool.free_queue.block_ids() == [4, 5, 3, 2, 1, 0]
    got = pool.take_new_blocks(5)
    assert [b.block_id for b in got] == [4, 5, 3, 2, 1]
    assert [(b.ref_cnt, b.block_hash) for b in got] == [(1, None)] * 5
    # The hook sees each evicted block while its hash is still findable, in LRU order.
    assert seen == [(2, H[2], True), (1, H[1], True)]
    assert log.drain().events == (BlockRemoved((H[2], H[1]), "device"),)
    assert pool.free_queue.block_ids() == [0] and pool.lookup(H[0]) is blocks[0]
    assert pool.num_cached_free_blocks == 1 and pool.num_evictions == 2
    pool.check_invariants()


def test_free_queue_matches_a_list_model_under_random_operations():
    rng = random.Random(0)
    blocks = [Block(i) for i in range(40)]
    queue = FreeBlockQueue(blocks)
    model = list(range(40))  # free block ids, LRU first
    held: list[int] = []
    for _ in range(3000):
        op = rng.randrange(4)
        if op == 0 and model:  # a run off the head
            n = rng.randint(0, len(model))
            assert [b.block_id for b in queue.popleft_blocks(n)] == model[:n]
            held += model[:n]
            del model[:n]
        elif op == 1 and model:  # removal from the middle (a cache hit revives it)
            i = rng.choice(model)
            queue.remove(blocks[i])
            model.remove(i)
            held.append(i)
        elif op == 2 and held:  # one block freed
            i = held.pop(rng.randrange(len(held)))
            queue.append(blocks[i])
            model.append(i)
        elif held:  # a request's blocks freed together
            rng.shuffle(held)
            n = rng.randint(0, len(held))
            queue.extend([blocks[i] for i in held[:n]])
            model += held[:n]
            del held[:n]
        assert queue.block_ids() == model
        assert queue.num_free_blocks == len(model)
        queue.check_invariants()


def test_free_queue_rejects_misnumbered_blocks_and_overlong_runs():
    with pytest.raises(ValueError, match="block_id"):
        FreeBlockQueue([Block(1)])
    queue = FreeBlockQueue([Block(0), Block(1)])
    with pytest.raises(ValueError, match="cannot pop 3 of 2"):
        queue.popleft_blocks(3)
    assert queue.block_ids() == [0, 1]


def test_stores_carry_their_tokens_when_the_log_records_them():
    """A block already held under its hash splits the run; each event gets its own tokens."""
    tokens = list(range(16 * 3))
    log = EventLog("r0", epoch="e", with_token_ids=True)
    pool = BlockPool(4, log)
    other, *blocks = pool.take_new_blocks(4)
    pool.cache_blocks([other], [H[1]], H[0])  # another request computed block 1 first
    log.drain()
    assert pool.cache_blocks(blocks, H[:3], None, tokens) == 2
    assert log.drain().events == (BlockStored((H[0],), None, "device", tuple(tokens[:16])),
                                  BlockStored((H[2],), H[1], "device", tuple(tokens[32:])))
    plain_log = EventLog("r1", epoch="e")
    plain = BlockPool(3, plain_log)
    plain.cache_blocks(plain.take_new_blocks(3), H[:3], None, tokens)
    assert plain_log.drain().events == (BlockStored(tuple(H[:3]), None, "device"),)
