"""The router's miss causes in the simulator: exact on a scripted run, and adding up to the
uncached prompt tokens on generated workloads, with one router and with two."""

import dataclasses

import pytest

from benchmarks.simlib import workloads as wl
from benchmarks.simlib.cluster import ClusterSim
from benchmarks.simlib.miss_classes import run_with_miss_causes
from router.core.miss_causes import MissTokens
from tests.sim.conftest import make_sim


def test_a_prompt_evicted_from_the_only_replica_comes_back_as_capacity():
    # 3 distinct 64-token prompts then the first again, on one replica of 8 blocks:
    # prompt 0's 4 blocks are evicted by prompts 1 and 2 before it comes back
    items = tuple(wl.WorkItem(f"r{i}", float(i), (wl.Segment(f"p{k}", 64),), 1)
                  for i, k in enumerate((0, 1, 2, 0)))
    run, check = run_with_miss_causes(make_sim(wl.Workload("t", items), num_replicas=1,
                                               num_blocks=8))
    assert [r.cached_device_tokens for r in run.records] == [0, 0, 0, 0]
    # each 64-token prompt computes its last token whatever is cached: cold, never capacity
    assert check.causes == MissTokens(cold=3 * 64 + 1, capacity=63)
    assert check.uncached_tokens == 4 * 64 and check.sum_ok


@pytest.mark.parametrize("policy, num_routers", [("cache_aware", 1), ("cache_aware", 2),
                                                 ("round_robin", 1)])
def test_causes_add_up_to_the_uncached_prompt_tokens_on_a_shared_prefix_load(policy,
                                                                             num_routers):
    # 12 groups of a 16-block system prompt on 3 replicas of 40 blocks: evictions
    w = wl.generated_shared_prefix(12, 8, 256, 64, 16, rate_qps=40.0, seed=1)
    sim = make_sim(w, num_replicas=3, num_blocks=40, policy=policy)
    sim = ClusterSim(dataclasses.replace(sim.config, num_routers=num_routers), w)
    run, check = run_with_miss_causes(sim)
    assert check.sum_ok, check
    assert check.causes.cold > 0 and check.causes.capacity > 0
    if policy == "round_robin":  # it ignores where the prefix is
        assert check.causes.placement > 0
    assert all(router.misses.num_outstanding() == 0 for router in sim.routers)
