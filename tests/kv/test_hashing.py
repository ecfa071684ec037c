import sys

import numpy as np
import pytest

from kv.hashing import block_hashes, hash_block, namespace_root

TOKENS = list(range(1, 33)) + [7]


def test_known_answers_from_design():
    root = namespace_root("tiny-llama")
    assert root.hex() == "988afa2c08aa7c6c0fced62001d99b55"
    assert [h.hex() for h in block_hashes(TOKENS, 16, root)] == [
        "268d4743c6c8ed65aaace30ba1a4914a",
        "cc65b57d7d4fc9f6428b741188963ef6",
    ]
    assert namespace_root("tiny-llama", salt="tenant-a").hex() == (
        "aee140e2c9b6d4072f6fbf6a00b13db6")
    assert namespace_root("tiny-llama", adapter="sql-lora").hex() == (
        "8745afa3ee50f30617b452cf12a3c8ed")


def test_numpy_and_list_inputs_agree():
    root = namespace_root("m")
    tokens = np.random.default_rng(0).integers(0, 2**32 - 1, 1000, dtype=np.int64)
    assert block_hashes(tokens, 16, root) == block_hashes(tokens.tolist(), 16, root)
    assert block_hashes((tokens % 1000).astype(np.int32), 16, root) == block_hashes(
        (tokens % 1000).tolist(), 16, root)


def test_extend_chain_equals_full_hash():
    root = namespace_root("m")
    tokens = list(range(100))
    full = block_hashes(tokens, 8, root)
    assert len(full) == 12
    tail = block_hashes(tokens, 8, root, start_block=5, parent_hash=full[4])
    assert full[5:] == tail
    assert hash_block(full[2], tokens[24:32]) == full[3]
    with pytest.raises(ValueError, match="parent_hash"):
        block_hashes(tokens, 8, root, start_block=2)


def test_namespaces_and_positions_differ():
    tokens = list(range(64))
    a = block_hashes(tokens, 16, namespace_root("m"))
    assert len(set(a)) == 4
    assert a != block_hashes(tokens, 16, namespace_root("m", salt="t"))
    assert a != block_hashes(tokens, 16, namespace_root("m", adapter="x"))
    # Field boundaries are unambiguous: ("ab", "") != ("a", "b").
    assert namespace_root("ab") != namespace_root("a", "b")


def test_matches_an_independent_implementation():
    xxhash = pytest.importorskip("xxhash")
    root = namespace_root("m", "a", "s")
    assert root == xxhash.xxh3_128_digest(b"kvroute/1\x00m\x00a\x00s")
    tokens = [1, 2**31 + 5, 3, 4]
    expected = xxhash.xxh3_128_digest(
        root + b"".join(t.to_bytes(4, "little") for t in tokens[:2]))
    assert block_hashes(tokens, 2, root)[0] == expected


def test_kv_does_not_import_torch_or_ray():
    import subprocess
    code = "import sys, kv; assert 'torch' not in sys.modules and 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_extending_from_every_block_equals_full_hashing():
    root = namespace_root("m")
    tokens = np.random.default_rng(1).integers(0, 2**32 - 1, 16 * 20 + 5).tolist()
    full = block_hashes(tokens, 16, root)
    for start in range(1, 21):  # 20 full blocks; start 20 extends by none
        tail = block_hashes(tokens, 16, root, start_block=start, parent_hash=full[start - 1])
        assert tail == full[start:]
        assert block_hashes(np.array(tokens), 16, root, start, full[start - 1]) == tail
    # Token by token, as a decode loop extends its chain when a block fills up.
    chain: list[bytes] = []
    for n in range(1, len(tokens) + 1):
        chain += block_hashes(tokens[:n], 16, root, len(chain), chain[-1] if chain else None)
    assert chain == full
    # Pinned known answer: block 1 of the design's example from block 0's hash alone.
    known = namespace_root("tiny-llama")
    b0 = bytes.fromhex("268d4743c6c8ed65aaace30ba1a4914a")
    assert [h.hex() for h in block_hashes(TOKENS, 16, known, 1, b0)] == [
        "cc65b57d7d4fc9f6428b741188963ef6"]
