"""An external worker's opaque block hashes mapped to Protocol 1 hashes."""

import hashlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kv.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, Snapshot
from kv.hashing import block_hashes, hash_block, namespace_root
from protocol.vllm import wire
from router.cluster.replica_log import ReplicaLog
from router.core.engine_hash_map import EngineHashConfig, EngineHashMap
from tests.protocol.vllm.recorded import recorded_batches

MODEL = "tiny-llama"
ROOT = namespace_root(MODEL)
# Protocol 1's known answers (docs/design.md, tests/kv/test_hashing.py): tokens 1..32,
# block size 16
R0 = bytes.fromhex("268d4743c6c8ed65aaace30ba1a4914a")
R1 = bytes.fromhex("cc65b57d7d4fc9f6428b741188963ef6")


def stored(hashes, parent, token_ids, block_size, medium="GPU", **kw):
    return wire.BlockStored(block_hashes=list(hashes), parent_block_hash=parent,
                            token_ids=list(token_ids), block_size=block_size, lora_id=None,
                            medium=medium, lora_name=None, **kw)


def removed(hashes, medium="GPU", **kw):
    return wire.BlockRemoved(block_hashes=list(hashes), medium=medium, **kw)


def test_recorded_vllm_events_map_to_protocol_1_hashes():
    m = EngineHashMap(EngineHashConfig(MODEL, router_block_size=16))
    batches = recorded_batches("0.33.0")
    r2 = block_hashes(list(range(1, 49)), 16, ROOT)[2]
    lora = hash_block(namespace_root(MODEL, adapter="sql-lora"), list(range(1, 17)))
    salted = hash_block(namespace_root(MODEL, salt="tenant-a"), list(range(1, 17)))
    assert namespace_root(MODEL, adapter="sql-lora").hex() == "8745afa3ee50f30617b452cf12a3c8ed"
    ints = block_hashes(list(range(100, 132)), 16, ROOT)

    out = [[m.apply(e) for e in b.events] for b in batches]
    assert out[0] == [BlockStored((R0, R1), None, "device"), BlockStored((r2,), None, "device")]
    assert out[1] == [BlockStored((lora,), None, "device"),
                      BlockStored((salted,), None, "device")]
    assert out[2] == [BlockStored((r2,), None, "host"), BlockRemoved((r2,), "device")]
    assert out[3] == [BlockStored(tuple(ints), None, "device"),
                      BlockRemoved((R0, R1), "device")]
    assert out[4] == [AllBlocksCleared()]
    assert m.contents() == {"device": set(), "host": set()}
    assert (m.stats.num_mapped_blocks, m.stats.num_unmapped_blocks) == (7, 0)


def test_router_blocks_twice_the_engine_blocks():
    """Engine 16, router 32: r0 is cached while both e0 and e1 are."""
    m = EngineHashMap(EngineHashConfig(MODEL, router_block_size=32))
    r0 = block_hashes(list(range(1, 33)), 32, ROOT)[0]
    assert m.apply(stored([b"e0"], None, range(1, 17), 16)) is None  # half a router block
    assert m.apply(stored([b"e1"], b"e0", range(17, 33), 16)) == BlockStored((r0,), None,
                                                                            "device")
    assert m.apply(removed([b"e0"])) == BlockRemoved((r0,), "device")  # e1 alone: not whole
    assert m.contents()["device"] == set()
    # e0 stored again (same content, same hash): r0 is whole again, via e1's old instance
    assert m.apply(stored([b"e0"], None, range(1, 17), 16)) == BlockStored((r0,), None,
                                                                           "device")
    m.check_invariants()


def test_engine_blocks_twice_the_router_blocks():
    m = EngineHashMap(EngineHashConfig(MODEL, router_block_size=16))
    assert m.apply(stored([b"e0"], None, range(1, 33), 32)) == BlockStored((R0, R1), None,
                                                                           "device")
    assert m.apply(removed([b"e0"])) == BlockRemoved((R0, R1), "device")


def test_physical_copies_and_unknown_removals():
    m = EngineHashMap(EngineHashConfig(MODEL, router_block_size=16))
    m.apply(stored([b"a"], None, range(1, 17), 16))
    assert m.apply(stored([b"a"], None, range(1, 17), 16)) is None  # a second copy
    assert m.apply(removed([b"a"])) is None  # one copy left
    assert m.apply(removed([b"zz"])) is None  # never stored
    assert m.contents()["device"] == {R0}
    assert m.apply(removed([b"a"])) == BlockRemoved((R0,), "device")
    m.check_invariants()


def test_unmappable_blocks_are_counted_and_left_out():
    m = EngineHashMap(EngineHashConfig(MODEL, router_block_size=16, lora_names_by_id={3: "x"}))
    assert m.apply(stored([b"c"], b"unknown-parent", range(1, 17), 16)) is None
    mm = [("sha-of-image", 0)]
    assert m.apply(stored([b"i"], None, range(1, 17), 16, extra_keys=[mm])) is None
    assert m.apply(stored([b"j"], b"i", range(17, 33), 16)) is None  # its parent is unmapped
    bad = stored([b"k"], None, range(1, 16), 16)  # 15 tokens for one 16-token block
    assert m.apply(bad) is None
    only_id = wire.BlockStored([b"l"], None, list(range(1, 17)), 16, 7, "GPU", None)
    assert m.apply(only_id) is None  # lora id 7 has no known name
    by_id = wire.BlockStored([b"n"], None, list(range(1, 17)), 16, 3, "GPU", None)
    assert m.apply(by_id) == BlockStored(
        (hash_block(namespace_root(MODEL, "x"), list(range(1, 17))),), None, "device")
    assert m.stats.num_unmapped_blocks == 5
    assert m.apply(removed([b"c", b"i", b"j"])) is None


def test_other_media_and_sliding_window_groups_are_ignored():
    m = EngineHashMap(EngineHashConfig(MODEL, router_block_size=16))
    assert m.apply(stored([b"s"], None, range(1, 17), 16, medium="STORAGE")) is None
    sw = stored([b"w"], None, range(1, 17), 16, group_idx=1,
                kv_cache_spec_kind="sliding_window")
    assert m.apply(sw) is None
    full = stored([b"w"], None, range(1, 17), 16, group_idx=0,
                  kv_cache_spec_kind="full_attention")
    assert m.apply(full) == BlockStored((R0,), None, "device")
    assert m.apply(removed([b"w"], group_idx=1)) is None  # the sliding-window copy
    assert m.contents()["device"] == {R0}
    assert m.stats.num_ignored_events == 3


# -- randomized: a mock engine's true contents against the map ------------------------------


def engine_hash(prefix: tuple[int, ...]) -> bytes:
    return hashlib.sha256(repr(prefix).encode()).digest()  # opaque, as vLLM's


def truth(held: dict[str, Counter], engine_size: int, router_size: int) -> dict[str, set]:
    """Router block j of a held prefix is cached in a medium when the engine blocks covering
    its tokens are all held there (computed from token prefixes, not from the map)."""
    out = {}
    for medium, counts in held.items():
        prefixes = {p for p, n in counts.items() if n > 0}
        hashes = set()
        for p in prefixes:
            for j, r in enumerate(block_hashes(list(p), router_size, ROOT)):
                first, last = j * router_size // engine_size, ((j + 1) * router_size - 1) \
                    // engine_size
                if all(p[:(k + 1) * engine_size] in prefixes for k in range(first, last + 1)):
                    hashes.add(r)
        out[medium] = hashes
    return out


@pytest.mark.parametrize("engine_size, router_size", [(2, 2), (2, 4), (4, 2), (2, 6), (6, 4)])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_map_matches_a_mock_engine(engine_size, router_size, data):
    m = EngineHashMap(EngineHashConfig(MODEL, router_block_size=router_size))
    held = {"device": Counter(), "host": Counter()}
    log = ReplicaLog("w")
    log.apply_snapshot(Snapshot("w", "e", 0, frozenset()))
    medium_name = {"device": "GPU", "host": "CPU"}
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["store", "store", "remove", "offload", "clear"]))
        events = []
        if op == "store":  # a request computes a prompt's blocks after its cached head
            num_blocks = data.draw(st.integers(1, 4))
            tokens = tuple(data.draw(st.lists(st.integers(0, 1), min_size=num_blocks *
                                              engine_size, max_size=num_blocks * engine_size)))
            prefixes = [tokens[:(k + 1) * engine_size] for k in range(num_blocks)]
            start = 0
            while start < num_blocks and held["device"][prefixes[start]] and data.draw(
                    st.booleans()):
                start += 1  # a cache hit: not stored again
            if start < num_blocks:
                parent = engine_hash(prefixes[start - 1]) if start else None
                for p in prefixes[start:]:
                    held["device"][p] += 1
                events.append(stored([engine_hash(p) for p in prefixes[start:]], parent,
                                     tokens[start * engine_size:], engine_size))
        elif op in ("remove", "offload"):
            medium = "device" if op == "offload" else data.draw(st.sampled_from(["device",
                                                                                 "host"]))
            candidates = sorted(p for p, n in held[medium].items() if n > 0)
            if candidates:
                p = data.draw(st.sampled_from(candidates))
                if op == "remove":
                    held[medium][p] -= 1
                    events.append(removed([engine_hash(p)], medium_name[medium]))
                elif not held["host"][p]:
                    held["host"][p] += 1
                    parent = engine_hash(p[:-engine_size]) if len(p) > engine_size else None
                    events.append(stored([engine_hash(p)], parent, p[-engine_size:],
                                         engine_size, medium="CPU"))
        else:
            held = {"device": Counter(), "host": Counter()}
            events.append(wire.AllBlocksCleared())
        out = [e for e in (m.apply(ev) for ev in events) if e is not None]
        log.publish(EventBatch("w", "e", log.next_seq, tuple(out)))
        m.check_invariants()
        expected = truth(held, engine_size, router_size)
        assert m.contents() == expected
        assert log.contents == expected  # the emitted events are exact deltas
