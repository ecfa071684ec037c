"""The index's flat hash table and per-replica row lists against plain dicts and sets."""

import random

import numpy as np
import pytest

from router.core.block_table import FEW_HASHES, BlockTable, key_words
from router.core.index import PrefixIndex, PrefixMatch
from tests.router.core.core_helpers import h


def _random_hash(rng: random.Random) -> bytes:
    # half share their first 8 bytes (zero), as the readable test hashes do: the bucket
    # must mix both words
    return h(rng.randrange(1 << 20)) if rng.random() < 0.5 else rng.randbytes(16)


@pytest.mark.parametrize("seed", range(3))
def test_table_matches_a_dict_through_growth_deletes_and_row_reuse(seed):
    rng = random.Random(seed)
    table = BlockTable(initial_rows=8)
    model: dict[bytes, int] = {}  # hash -> row
    peak = 0
    for step in range(300):
        if model and rng.random() < 0.35:  # free a random part
            gone = rng.sample(sorted(model), rng.randint(1, len(model)))
            rows = np.array([model.pop(x) for x in gone])
            table.masks[rows] = 0
            table.free(rows)
        else:
            batch = [_random_hash(rng) for _ in range(rng.randint(1, 40))]
            batch += rng.sample(sorted(model), min(len(model), 5))  # present ones
            batch += batch[:3]  # repeated within the batch
            rows = table.intern(key_words(batch))
            for x, row in zip(batch, rows.tolist()):
                assert model.setdefault(x, row) == row, "a hash got two rows"
            table.masks[rows, 0] = 1
        assert len(set(model.values())) == len(model) == table.num_live
        peak = max(peak, len(model))
        probe = sorted(model)[:50] + [_random_hash(rng) for _ in range(20)]
        want = [model.get(x, 0) for x in probe]
        assert table.lookup(key_words(probe)).tolist() == want
        assert [table.lookup_one(x) or 0 for x in probe] == want
        assert table.hashes(np.array(want[:10], np.intp)) == [
            x if row else bytes(16) for x, row in zip(probe[:10], want[:10])]
        if step % 20 == 0:
            table.check_invariants()
    table.check_invariants()
    assert len(table._heads) >= 2 * table.num_live
    assert len(table.keys) <= 1.5 * (peak + 1) + 8  # freed rows were reused first


@pytest.mark.parametrize("seed", range(3))
def test_one_hash_at_a_time_and_arrays_keep_one_table(seed):
    """intern_one / free_one / lookup_hashes (a few hashes, in Python ints) and the arrays'
    intern / free / lookup, mixed at random on one table, against a dict."""
    rng = random.Random(seed)
    table = BlockTable(initial_rows=4)
    model: dict[bytes, int] = {}
    for step in range(400):
        if model and rng.random() < 0.4:
            gone = rng.sample(sorted(model), rng.randint(1, min(len(model), 2 * FEW_HASHES)))
            rows = [model.pop(x) for x in gone]
            table.masks[rows] = 0
            if rng.random() < 0.5:
                for row in rows:
                    table.free_one(row)
            else:
                table.free(np.array(rows))
        else:
            batch = [_random_hash(rng) for _ in range(rng.randint(1, 2 * FEW_HASHES))]
            batch += rng.sample(sorted(model), min(len(model), 2)) + batch[:1]
            if rng.random() < 0.5:
                rows = [table.intern_one(x) for x in batch]
            else:
                rows = table.intern(key_words(batch)).tolist()
            for x, row in zip(batch, rows):
                assert model.setdefault(x, row) == row, "a hash got two rows"
            table.masks[rows, 0] = 1
        probe = rng.sample(sorted(model), min(len(model), 6)) + [_random_hash(rng)]
        want = [model.get(x, 0) for x in probe]
        assert table.lookup_hashes(probe).tolist() == want  # a few: one by one
        many = probe * (FEW_HASHES // len(probe) + 1)  # more: the arrays
        assert table.lookup_hashes(many).tolist() == [model.get(x, 0) for x in many]
        assert table.num_live == len(model)
        if step % 25 == 0:
            table.check_invariants()
    table.check_invariants()
    alone = BlockTable(initial_rows=4)
    for i in range(3000):
        alone.intern_one(h(i))
    assert len(alone._heads) >= 2 * alone.num_live == 6000  # intern_one rehashes too
    row = table.intern_one(h(1 << 30))
    table.free_one(row)
    with pytest.raises(ValueError, match="not a live row"):
        table.free_one(row)  # twice: refused, not a walk of its chain forever
    assert table.num_live == len(model)
    with pytest.raises(ValueError, match="16 bytes"):
        table.intern_one(b"short")
    with pytest.raises(ValueError, match="16 bytes"):
        table.lookup_hashes([b"short"])


def test_key_words_refuses_hashes_that_are_not_16_bytes():
    with pytest.raises(ValueError, match="16 bytes"):
        key_words([h(1), b"short"])
    assert key_words([]).shape == (0, 2)


def test_more_than_32_replicas_widen_the_masks_and_match_the_slow_way():
    rng = random.Random(7)
    index = PrefixIndex()
    replicas = [f"r{i}" for i in range(70)]  # 140 bits: three words, doubled to four
    prompt = [h(i) for i in range(40)]
    truth = {}
    for rid in replicas:
        device = rng.randint(0, 40)
        host = rng.randint(device, 40)
        truth[rid] = (prompt[:device], prompt[device:host])
        index.add_blocks(rid, "device", prompt[:device])
        index.add_blocks(rid, "host", prompt[device:host])
    assert index._table.num_words == 4
    index.check_invariants()
    want = {rid: PrefixMatch(len(d), len(hs)) for rid, (d, hs) in truth.items() if d or hs}
    assert index.match(prompt, replicas) == want
    assert index.holders(prompt[0]) == {rid for rid, (d, _) in truth.items() if d}
    index.remove_replica("r69")
    del want["r69"]
    assert index.match(prompt, replicas) == want
    index.check_invariants()


@pytest.mark.parametrize("size", [100, FEW_HASHES])  # the arrays; one hash at a time
def test_row_lists_stay_small_under_churn_and_survive_rows_reused_for_other_hashes(size):
    index = PrefixIndex()
    a, b = [h(i) for i in range(size)], [h(1000 + i) for i in range(size)]
    for _ in range(50):  # a block leaves the index and its row is reused at once
        index.add_blocks("r0", "device", a)
        index.remove_blocks("r0", "device", a)
        index.add_blocks("r1", "device", b)
        index.add_blocks("r0", "device", b)
        index.remove_blocks("r1", "device", b)
        index.remove_blocks("r0", "device", b[:size // 2])
        index.check_invariants()
        index.remove_blocks("r0", "device", b[size // 2:])
    index.add_blocks("r0", "device", a[:10])
    index.check_invariants()
    assert index._replicas["r0"].held["device"]._len < 10 + 64 < 50 * size
    assert index.blocks_of("r0") == frozenset(a[:10]) and index.blocks_of("r1") == frozenset()
    assert len(index.held_view("r0")) == 10 and a[3] in index.held_view("r0")
    assert b[3] not in index.held_view("r0") and "not a hash" not in index.held_view("r0")
    assert sorted(index.held_view("r0")) == a[:10]
    held = index._replicas["r0"].held["device"]
    assert held._len <= 64 + 10, "stale rows were never dropped"
    assert index.num_blocks("device") == index.num_distinct_blocks() == 10


def test_hashes_that_share_their_second_word_are_told_apart():
    """A probe compares one word; hashes equal in it must still get their own rows."""
    rng = random.Random(3)
    table = BlockTable()
    same = [rng.randbytes(8) + b"samesame" for i in range(3000)]
    rows = table.intern(key_words(same))
    table.masks[rows, 0] = 1
    assert len(set(rows.tolist())) == 3000
    assert table.lookup(key_words(same[::-1])).tolist() == rows.tolist()[::-1]
    absent = [rng.randbytes(8) + b"samesame" for i in range(100)]
    assert table.lookup(key_words(absent)).tolist() == [0] * 100
    table.check_invariants()


@pytest.mark.parametrize("num_hashes", [2, FEW_HASHES + 2])  # one by one; the arrays
def test_a_run_with_a_bad_hash_changes_nothing(num_hashes):
    index = PrefixIndex()
    good = [h(i) for i in range(num_hashes)]
    index.add_blocks("r0", "device", good)
    new = [h(100 + i) for i in range(num_hashes - 1)]
    for bad_run in (good[:-1] + [b"short"], new + [b"short"]):  # num_hashes long
        with pytest.raises(ValueError, match="16 bytes"):
            index.add_blocks("r0", "device", bad_run)
        with pytest.raises(ValueError, match="16 bytes"):
            index.remove_blocks("r0", "device", bad_run)
    assert index.blocks_of("r0") == frozenset(good)
    assert index.num_distinct_blocks() == num_hashes
    index.check_invariants()


@pytest.mark.parametrize("num_hashes", [1, FEW_HASHES + 1])  # one by one; the arrays
def test_a_row_another_word_holds_stays_when_one_replica_drops_it(num_hashes):
    """40 replicas: two mask words. r0 (word 0) drops the blocks r39 (word 1) holds on its
    host tier: they stay indexed, counted on the host only."""
    index = PrefixIndex()
    blocks = [h(i) for i in range(num_hashes)]
    for i in range(40):
        index.add_blocks(f"r{i}", "device", [h(10_000 + i)])
    index.add_blocks("r0", "device", blocks)
    index.add_blocks("r39", "host", blocks)
    index.remove_blocks("r0", "device", blocks + blocks[:1])  # a repeat too
    index.check_invariants()
    assert index.blocks_of("r39", "host") == frozenset(blocks)
    assert index.num_distinct_blocks() == 40 + num_hashes
    assert (index.num_blocks("device"), index.num_blocks("host")) == (40, num_hashes)
