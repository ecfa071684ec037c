"""The pooled curve's sample rate: it starts dense, halves as the fleet's capacity grows
(never below R), and a curve whose rate was lowered reads as one sampled low all along."""

import random
from collections import Counter

import pytest

from kv.hashing import block_hashes, namespace_root
from router.core.hit_curve import AccessCounts, HitCurveConfig, PooledHitCurve
from router.core.shards import ReuseDistances, sample_threshold, sampled_hashes

B = 16
ROOT = namespace_root("hit-curve-rate-test")


def test_keep_below_leaves_what_the_lower_rate_would_have_tracked():
    rng = random.Random(11)
    keys = [bytes([i * 6]) * 16 for i in range(40)]  # first bytes 0x00 .. 0xea
    threshold = b"\x80" + bytes(7)
    lowered, low_all_along = ReuseDistances(max_blocks=1000), ReuseDistances(max_blocks=1000)
    for step in range(3000):
        key = keys[min(int(rng.expovariate(0.08)), 39)]
        if step == 1500:
            lowered.keep_below(threshold)
            lowered.check_invariants()
        if step >= 1500 and key >= threshold:
            continue  # the curve thins what arrives after the rate was lowered
        if key < threshold:
            if step >= 1500:
                assert lowered.lookup(key) == low_all_along.lookup(key)
            low_all_along.touch(key)
        lowered.touch(key)
    lowered.check_invariants()
    assert len(lowered) == len(low_all_along) == sum(k < threshold for k in keys)
    assert [lowered.lookup(k) for k in keys] == [low_all_along.lookup(k) for k in keys]


def test_the_rate_halves_with_the_capacity_down_to_r_and_never_rises():
    config = HitCurveConfig(sample_rate=0.125, max_rate_doublings=3,
                            capacity_sampled_blocks=100)
    curve = PooledHitCurve(config, clock=lambda: 0.0)
    assert curve.sample_rate == 1.0
    curve.set_capacity(100)  # 1.0 x 100 blocks <= 100
    assert curve.sample_rate == 1.0
    curve.set_capacity(300)  # 0.5 x 300 > 100 >= 0.25 x 300
    assert curve.sample_rate == 0.25
    curve.set_capacity(10**6)
    assert curve.sample_rate == 0.125
    curve.set_capacity(10)
    assert curve.sample_rate == 0.125
    # it starts at the most doublings that keep it at most 1
    assert HitCurveConfig(sample_rate=0.3, max_rate_doublings=6).start_level == 1
    assert HitCurveConfig(sample_rate=0.01, max_rate_doublings=0).start_level == 0
    with pytest.raises(ValueError, match="max_rate_doublings"):
        HitCurveConfig(max_rate_doublings=-1)


def test_each_rates_lookups_weigh_one_over_the_rate():
    # R = 0.25: level 0 sampled at 0.25 (weight 4), level 2 at 1.0 (weight 1)
    counts = AccessCounts(distances={0: Counter({5: 3}), 2: Counter({1: 1})}, cold=Counter({0: 1}),
                          num_blocks=10, num_block_tokens=10 * B, num_prompt_tokens=10 * B)
    # at 30 blocks both hit (5 < 30 x 0.25, 1 < 30 x 1); at 10 only the level-2 one does
    assert counts.hit_ratios([30, 10, float("inf")], 0.25) == [13 / 17, 1 / 17, 13 / 17]
    assert counts.num_hits(10, 0.25) == 1


def _prompts(seed: int, num_prompts: int) -> list[list[bytes]]:
    rng = random.Random(seed)
    heads = [[rng.randrange(1000) for _ in range(B * 6)] for _ in range(5)]
    return [block_hashes(rng.choice(heads) + [rng.randrange(1000) for _ in range(B * 3)], B,
                         ROOT) for _ in range(num_prompts)]


def test_a_lowered_curve_counts_as_one_sampled_low_from_the_start():
    prompts = _prompts(5, 300)
    dense = PooledHitCurve(HitCurveConfig(sample_rate=0.25, max_rate_doublings=2,
                                          capacity_sampled_blocks=10),
                           clock=lambda: 0.0)
    low = PooledHitCurve(HitCurveConfig(sample_rate=0.25, max_rate_doublings=0),
                         clock=lambda: 0.0)
    t = sample_threshold(0.25)
    for i, hashes in enumerate(prompts):
        if i == 150:
            before = AccessCounts()
            before.add(low.counts("all"))
            dense.set_capacity(40)  # 0.25 x 40 = 10: down to R
            assert dense.sample_rate == 0.25
        dense.add_prompts([hashes], 1.0, len(hashes), len(hashes) * B, B)  # thinned
        dense.add_released([hashes], 1.0)
        low.add_prompts([sampled_hashes(hashes, t)], 0.25, len(hashes), len(hashes) * B, B)
        low.add_released([sampled_hashes(hashes, t)], 0.25)
    after, mixed = low.counts("all"), dense.counts("all")
    # the first half counted at 1.0 (level 2), the second at 0.25 (level 0)
    assert set(mixed.distances) == set(mixed.cold) == {0, 2}
    assert mixed.distances[0] == after.distances[0] - before.distances[0]
    assert mixed.cold[0] == after.cold[0] - before.cold[0]
    with pytest.raises(ValueError, match="sampled at 0.125"):
        dense.add_prompts([prompts[0]], 0.125, 9, 9 * B, B)
