"""KV core micro-benchmarks: hashing, prefix match, allocate + free, scaling with pool size.

Prints a table, then one JSON object as the last line. Every figure is the median of
several timed repeats measured in this run; nothing is assumed.

    python benchmarks/bench_kv.py
"""

from __future__ import annotations

import hashlib
import json
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kv.hashing import DEFAULT_BLOCK_SIZE, block_hashes, namespace_root  # noqa: E402
from kv.manager import KVCacheConfig, KVCacheManager  # noqa: E402

BLOCK_SIZE = DEFAULT_BLOCK_SIZE
PROMPT_TOKENS = 8192
ROOT = namespace_root("bench-model")


def median_time_ns(fn, repeats: int, inner: int = 1) -> float:
    """Median over `repeats` of the mean time of `inner` calls, in ns per call."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter_ns() - t0) / inner)
    return statistics.median(samples)


def sha256_pickle_chain(tokens: list[int], block_size: int) -> list[bytes]:
    """The common engine default: SHA-256 over pickle((parent, block tokens)), highest
    pickle protocol, as vLLM's sha256 block hash does."""
    out, parent = [], b""
    for i in range(0, len(tokens) - block_size + 1, block_size):
        parent = hashlib.sha256(pickle.dumps((parent, tuple(tokens[i : i + block_size])),
                                             protocol=pickle.HIGHEST_PROTOCOL)
                                ).digest()
        out.append(parent)
    return out


def filled_manager(num_blocks: int, rng: np.random.Generator) -> KVCacheManager:
    """A pool whose every block is cached (freed, findable), as in a warm replica."""
    mgr = KVCacheManager(KVCacheConfig(num_blocks=num_blocks, block_size=BLOCK_SIZE))
    chunk = 4096  # blocks per filler request
    for n in range(0, num_blocks, chunk):
        k = min(chunk, num_blocks - n)
        tokens = rng.integers(0, 128000, k * BLOCK_SIZE, dtype=np.int64)
        h = block_hashes(tokens, BLOCK_SIZE, ROOT)
        rid = f"fill{n}"
        mgr.allocate(rid, k * BLOCK_SIZE, h)
        mgr.cache_blocks(rid, h, k * BLOCK_SIZE)
        mgr.free(rid)
    return mgr


def alloc_free_requests(mgr: KVCacheManager, rng: np.random.Generator, n: int):
    """n requests of 512 blocks whose first 256 blocks are cached in `mgr`."""
    shared = rng.integers(0, 128000, 256 * BLOCK_SIZE, dtype=np.int64).tolist()
    warm = block_hashes(shared, BLOCK_SIZE, ROOT)
    mgr.allocate("warm", len(shared), warm)
    mgr.cache_blocks("warm", warm, len(shared))
    mgr.free("warm")
    tails = rng.integers(0, 128000, (n, 256 * BLOCK_SIZE)).tolist()
    return [(f"q{i}", block_hashes(shared + tail, BLOCK_SIZE, ROOT))
            for i, tail in enumerate(tails)]


def alloc_free_ns(mgr: KVCacheManager, rid: str, h: list[bytes]) -> int:
    """Times match + allocate, then free. In between, untimed, the request's blocks get
    their hashes as an engine's do once computed: so the pool stays warm (every free block
    cached) and each allocation evicts cached blocks, in the 10k pool as in the 1M one.
    Freed uncached, the 10k pool would soon have only hashless free blocks and its
    allocations would evict nothing, a cheaper operation than the 1M pool's."""
    t0 = time.perf_counter_ns()
    m = mgr.match(h)
    mgr.allocate(rid, 512 * BLOCK_SIZE, h, m)
    dt = time.perf_counter_ns() - t0
    mgr.cache_blocks(rid, h, 512 * BLOCK_SIZE)
    t0 = time.perf_counter_ns()
    mgr.free(rid)
    dt += time.perf_counter_ns() - t0
    assert m.num_device_blocks == 256
    return dt


def cached_prompt(mgr: KVCacheManager, rng: np.random.Generator) -> list[bytes]:
    """Hashes of an 8k-token prompt whose blocks are all cached in `mgr`."""
    h = block_hashes(rng.integers(0, 128000, PROMPT_TOKENS, dtype=np.int64), BLOCK_SIZE, ROOT)
    mgr.allocate("p", PROMPT_TOKENS, h)
    mgr.cache_blocks("p", h, PROMPT_TOKENS)
    mgr.free("p")
    assert mgr.match(h).num_device_blocks == len(h)
    return h


def main() -> None:
    # The machine is shared and noisy: every comparison is measured interleaved (A, B,
    # A, B, ...) and reported as medians, so a burst of load hits both sides alike.
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 128000, PROMPT_TOKENS, dtype=np.int64).tolist()

    hash_samples, sha_samples = [], []
    for _ in range(25):
        hash_samples.append(median_time_ns(lambda: block_hashes(prompt, BLOCK_SIZE, ROOT), 1, 10))
        sha_samples.append(median_time_ns(lambda: sha256_pickle_chain(prompt, BLOCK_SIZE), 1, 2))
    hash_ns, sha_ns = statistics.median(hash_samples), statistics.median(sha_samples)

    small = filled_manager(10_000, rng)
    big = filled_manager(1_000_000, rng)
    h_small, h_big = cached_prompt(small, rng), cached_prompt(big, rng)
    reqs_small = alloc_free_requests(small, rng, 150)
    reqs_big = alloc_free_requests(big, rng, 150)
    match_small, match_big, af_small, af_big = [], [], [], []
    for _ in range(100):  # before the alloc/free churn evicts the cached prompts
        match_small.append(median_time_ns(lambda: small.match(h_small), 1, 5))
        match_big.append(median_time_ns(lambda: big.match(h_big), 1, 5))
    assert small.match(h_small).num_device_blocks == big.match(h_big).num_device_blocks == 512
    for (rs, hs), (rb, hb) in zip(reqs_small, reqs_big):
        af_small.append(alloc_free_ns(small, rs, hs))
        af_big.append(alloc_free_ns(big, rb, hb))
    small.check_invariants()
    med = statistics.median
    m_small, m_big, a_small, a_big = med(match_small), med(match_big), med(af_small), med(af_big)

    rows = [
        ("hash 8,192 tokens (xxh3-128 chain)", hash_ns),
        ("hash 8,192 tokens (pickle + SHA-256 chain)", sha_ns),
        ("match 8k cached prompt, pool 10,000", m_small),
        ("match 8k cached prompt, pool 1,000,000", m_big),
        ("alloc+free 512 blocks (half cached), pool 10,000", a_small),
        ("alloc+free 512 blocks (half cached), pool 1,000,000", a_big),
    ]
    result = {
        "hash_ns_per_token": round(hash_ns / PROMPT_TOKENS, 2),
        "sha256_pickle_ns_per_token": round(sha_ns / PROMPT_TOKENS, 2),
        "hash_speedup_vs_sha256": round(sha_ns / hash_ns, 2),
        "match_us_8k": round(m_big / 1e3, 1),
        "alloc_free_us_512": round(a_big / 1e3, 1),
        "scaling_ratio": round(max(m_big / m_small, a_big / a_small), 3),
        "scaling_ratio_match": round(m_big / m_small, 3),
        "scaling_ratio_alloc_free": round(a_big / a_small, 3),
    }
    print(f"{'operation':<54} {'median':>10}")
    for name, ns in rows:
        print(f"{name:<54} {ns / 1e3:>7.1f} us")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
