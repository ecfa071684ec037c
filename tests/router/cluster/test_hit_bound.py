"""The hit-bound actor's replay and series: capacity multiples of the fleet's device KV,
batches sampled at another rate, and (slow) the whole path through real Ray."""

import asyncio

import pytest
import ray
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kv.hashing import block_hashes, namespace_root
from router.cluster.hit_bound import HitBound, HitBoundLink, get_hit_bound
from router.core.access_sampler import AccessSampler, SamplerConfig
from router.core.hit_curve import HitCurveConfig

B = 16
ROOT = namespace_root("hit-bound-test")


def _series(bound: HitBound) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(generate_latest(bound.registry).decode())
            for s in fam.samples if not s.name.endswith("_created")}


def _prompt(head: int, tail: int) -> list[bytes]:
    """Two shared head blocks (by `head`), one private tail block (by `tail`)."""
    return block_hashes([head] * 2 * B + [1000 + tail] * B, B, ROOT)


def _batch(prompts: list[list[bytes]], rate: float, capacity_blocks: int | None):
    sampler = AccessSampler("g", B, SamplerConfig(sample_rate=rate))
    for p in prompts:
        sampler.on_routed(p, len(p) * B)
    return sampler.take(capacity_blocks)


def test_series_at_each_capacity_multiple_once_the_capacity_is_known():
    bound = HitBound(HitCurveConfig(sample_rate=1.0), clock=lambda: 0.0)
    # a, b (cold: 6 blocks), then a's head again with a new tail: its first block at
    # distance 3 (b's three blocks since), its second at 4 (and a's first), the tail cold;
    # b's head again: 3 and 4
    prompts = [_prompt(1, 1), _prompt(2, 2), _prompt(1, 3), _prompt(2, 4)]
    assert bound.add(_batch(prompts, 1.0, capacity_blocks=None))
    bound.refresh()
    values = _series(bound)
    # with no capacity known only the infinite rung: 4 of the 12 blocks hit
    assert values == {("kvroute_pooled_hit_ratio", (("capacity", "inf"), ("window", w))): 4 / 12
                      for w in ("all", "recent")} | {("kvroute_pooled_sampled_accesses_total",
                                                       ()): 24}
    # the capacity comes with a later batch: one more prompt, all cold
    assert bound.add(_batch([_prompt(3, 5)], 1.0, capacity_blocks=8))
    bound.refresh()
    values = _series(bound)
    assert values[("kvroute_pooled_sampled_accesses_total", ())] == 30
    for label, expected in (("0.5x", 2 / 15), ("1x", 4 / 15), ("2x", 4 / 15), ("4x", 4 / 15),
                            ("inf", 4 / 15)):
        assert values[("kvroute_pooled_hit_ratio", (("capacity", label),
                                                    ("window", "all")))] == expected


def test_a_denser_batch_is_thinned_and_a_sparser_one_refused():
    prompts = [_prompt(h, t) for h in range(20) for t in range(3)]
    fixed = HitCurveConfig(sample_rate=0.5, max_rate_doublings=0)
    dense = HitBound(fixed, clock=lambda: 0.0)
    assert dense.add(_batch(prompts, 1.0, 100))  # thinned to its own rate on arrival
    same = HitBound(fixed, clock=lambda: 0.0)
    assert same.add(_batch(prompts, 0.5, 100))
    assert dense.curve.counts("all") == same.curve.counts("all")
    assert dense.curve.counts("all").num_sampled > 0
    assert not same.add(_batch(prompts, 0.25, 100))
    assert same.num_rejected_batches == 1


def test_record_answers_the_rate_a_sparser_batch_or_a_larger_fleet_lowers():
    prompts = [_prompt(h, t) for h in range(20) for t in range(3)]
    bound = HitBound(HitCurveConfig(sample_rate=0.25, max_rate_doublings=2,
                                    capacity_sampled_blocks=100), clock=lambda: 0.0)
    assert bound.sample_rate() == 1.0
    # a sender still at a restarted actor's lower rate brings the actor down to it
    assert asyncio.run(bound.record(_batch(prompts, 0.5, None))) == 0.5
    assert asyncio.run(bound.record(_batch(prompts, 1.0, 200))) == 0.5  # 0.5 x 200 <= 100
    assert asyncio.run(bound.record(_batch(prompts, 1.0, 201))) == 0.25
    assert asyncio.run(bound.record(_batch(prompts, 0.125, 201))) == 0.25  # below R: refused
    assert bound.stats() == {"num_sampled_accesses": bound.curve.num_sampled_accesses,
                             "capacity_blocks": 201, "num_rejected_batches": 1,
                             "sample_rate": 0.25}
    assert set(bound.curve.counts("all").distances) == {0, 1}


@pytest.mark.slow
def test_routers_and_replicas_samples_reach_the_actor_through_ray():
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=128 * 1024**2,
             log_to_driver=False, namespace="hit-bound-test")
    try:
        # starts at 1.0; a fleet above 64 blocks is sampled at 0.5
        config = HitCurveConfig(sample_rate=0.5, max_rate_doublings=1,
                                capacity_sampled_blocks=64)
        routers = [HitBoundLink(f"g{i}", B, config) for i in range(2)]
        replica = HitBoundLink("engine/r0", B)  # finds the actor, learns its rate
        for i, link in enumerate(routers):  # two routers, each routing each head once
            link.capacity_blocks = 64
            for head in range(3):
                link.sampler.on_routed(_prompt(head, i), 3 * B)
        replica.sampler.on_released(_prompt(0, 9))  # a finished sequence's blocks

        async def send(links):
            for link in links:
                await link.send_once()
        asyncio.run(send(routers + [replica]))
        routers[0].sampler.on_routed(_prompt(0, 9), 3 * B)  # all three blocks cached
        asyncio.run(send(routers[:1]))
        actor = get_hit_bound(config)
        # 7 prompts, 21 blocks: the second router's 6 head blocks and the last prompt's 3 hit
        assert ray.get(actor.hit_ratio.remote(64, "all")) == 9 / 21
        assert ray.get(actor.stats.remote()) == {"num_sampled_accesses": 45,
                                                 "capacity_blocks": 64,
                                                 "num_rejected_batches": 0,
                                                 "sample_rate": 1.0}
        assert replica.sampler.config.sample_rate == 1.0  # asked the actor
        routers[1].capacity_blocks = 65  # the fleet grew: the actor halves its rate
        routers[1].sampler.on_routed(_prompt(1, 9), 3 * B)
        asyncio.run(send(routers[1:]))
        assert ray.get(actor.sample_rate.remote()) == 0.5
        assert routers[1].sampler.config.sample_rate == 0.5  # from the actor's answer
    finally:
        ray.shutdown()
