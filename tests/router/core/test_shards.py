"""The online pooled bound's pieces: the SHARDS threshold, reuse distances against a
brute-force LRU, the windowed curve, and a router's sampler."""

import random

import pytest

from benchmarks.simlib.pooled import PooledLRU
from kv.hashing import block_hashes, namespace_root
from router.core.access_sampler import AccessSampler, SamplerConfig, sample_lists
from router.core.hit_curve import HitCurveConfig, PooledHitCurve
from router.core.shards import ReuseDistances, sample_threshold, sampled_hashes

B = 16
ROOT = namespace_root("shards-test")


def test_threshold_keeps_exactly_the_hashes_below_r_times_2_to_the_64():
    t = sample_threshold(0.5)
    assert t == b"\x80" + bytes(7)
    below = (0x7FFF_FFFF_FFFF_FFFF).to_bytes(8, "big") + b"\xff" * 8
    at = (0x8000_0000_0000_0000).to_bytes(8, "big") + bytes(8)
    assert sampled_hashes([at, below, b"\x00" * 16], t) == [below, b"\x00" * 16]
    everything = [b"\xff" * 16, bytes(16)]
    assert sampled_hashes(everything, sample_threshold(1.0)) == everything
    assert sample_threshold(0.01) == (184467440737095516).to_bytes(8, "big")
    with pytest.raises(ValueError, match="sample_rate"):
        sample_threshold(0.0)


def _brute_distance(stack: list[bytes], key: bytes) -> int | None:
    """Distinct keys touched after `key`'s last touch (stack: most recent last)."""
    return len(stack) - 1 - stack.index(key) if key in stack else None


def test_reuse_distances_match_a_brute_force_stack():
    rng = random.Random(7)
    keys = [bytes([i]) * 16 for i in range(40)]
    reuse, stack = ReuseDistances(max_blocks=25), []
    for _ in range(3000):
        key = keys[min(int(rng.expovariate(0.08)), 39)]
        assert reuse.lookup(key) == _brute_distance(stack, key)
        reuse.touch(key)
        if key in stack:
            stack.remove(key)
        stack.append(key)
        del stack[:-25]  # the tracker forgets the least recent beyond max_blocks
        reuse.check_invariants()
    assert len(reuse) == 25


def _stream(seed: int, num_requests: int) -> list[tuple[list[bytes], int]]:
    """Prompts from 6 shared heads of 1-8 blocks and private tails, each ending in a
    partial block (so the engine's last-token rule never trims a hit)."""
    rng = random.Random(seed)
    heads = [[rng.randrange(1000) for _ in range(B * rng.randint(1, 8))] for _ in range(6)]
    out = []
    for _ in range(num_requests):
        tokens = rng.choice(heads) + [rng.randrange(1000) for _ in range(rng.randint(1, 40))]
        if len(tokens) % B == 0:
            tokens.append(1)
        out.append((block_hashes(tokens, B, ROOT), len(tokens)))
    return out


@pytest.mark.parametrize("capacity_blocks", [1, 3, 8, 20, 45, 200])
def test_at_rate_one_the_curve_is_the_exact_pooled_lru(capacity_blocks):
    curve = PooledHitCurve(HitCurveConfig(sample_rate=1.0), clock=lambda: 0.0)
    lru = PooledLRU(capacity_blocks, B)
    for i, (hashes, num_tokens) in enumerate(_stream(3, 400)):
        lru.serve_prompt(hashes, num_tokens)
        curve.add_prompts([hashes], 1.0, len(hashes), num_tokens, B)
        if i % 3 == 0:  # a finished sequence is cached again, as the simulator does
            lru.release(hashes)
            curve.add_released([hashes], 1.0)
    counts = curve.counts("all")
    assert counts.num_hits(capacity_blocks, 1.0) * B == lru.hit_tokens
    assert counts.num_prompt_tokens == lru.query_tokens
    assert curve.hit_ratio(capacity_blocks, "all") == pytest.approx(lru.hit_rate, rel=1e-12)
    assert counts.hit_ratios([capacity_blocks], 1.0) == [curve.hit_ratio(capacity_blocks,
                                                                          "all")]


def test_recent_window_forgets_whole_buckets_and_all_keeps_everything():
    now = [0.0]
    curve = PooledHitCurve(HitCurveConfig(sample_rate=1.0, recent_window_s=600,
                                          num_buckets=10), clock=lambda: now[0])
    a = block_hashes(list(range(2 * B)), B, ROOT)
    curve.add_prompts([a], 1.0, 2, 2 * B, B)  # cold, in the bucket [0, 60)
    now[0] = 30.0
    curve.add_prompts([a], 1.0, 2, 2 * B, B)  # both hit
    now[0] = 100.0
    curve.add_prompts([a[:1]], 1.0, 1, B, B)  # a hit, in the bucket [60, 120)
    assert curve.hit_ratio(10, "recent") == pytest.approx(3 / 5)
    now[0] = 659.9  # the window [59.9, 659.9] still touches the first bucket
    assert curve.hit_ratio(10, "recent") == pytest.approx(3 / 5)
    now[0] = 660.0
    assert curve.hit_ratio(10, "recent") == 1.0
    now[0] = 720.0
    assert curve.hit_ratio(10, "recent") is None
    assert curve.hit_ratio(10, "all") == pytest.approx(3 / 5)


def test_sampler_batches_what_it_kept_and_drops_whole_prompts_when_full():
    sampler = AccessSampler("g", B, SamplerConfig(sample_rate=0.5, max_pending_prompts=3))
    assert sampler.take(None) is None
    hashes = [bytes([i * 16]) * 16 for i in range(16)]  # first bytes 0x00..0xf0
    sampler.on_routed(hashes[:4], 4 * B + 3)  # 0x00..0x30: all four below 0x80
    sampler.on_routed(hashes[8:], 8 * B)  # none below: counted, nothing kept
    sampler.on_routed(hashes[6:10], 4 * B)  # 0x60, 0x70 kept
    sampler.on_routed(hashes[:1], B)  # three prompts pending already: dropped
    batch = sampler.take(capacity_blocks=100)
    assert batch.prompts() == [hashes[:4], hashes[6:8]]
    assert (batch.num_blocks, batch.num_prompt_tokens, batch.num_dropped_prompts) == (
        16, 16 * B + 3, 1)
    assert (batch.capacity_blocks, batch.num_sampled, batch.sample_rate) == (100, 6, 0.5)
    assert sampler.take(None) is None


def test_sample_lists_concatenates_each_lists_kept_hashes_and_counts_them():
    t = sample_threshold(0.5)
    low, high = [bytes([i]) * 16 for i in (0x10, 0x20)], [bytes([0x90]) * 16]
    assert sample_lists([low + high, high, low[1:]], t) == (b"".join(low + low[1:]), (2, 1))
