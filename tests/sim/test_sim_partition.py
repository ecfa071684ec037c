"""benchmarks/sim_partition.py: the group-quota oracle keeps each group whole, by quota."""

from collections import defaultdict

import pytest

from benchmarks.sim_partition import GroupQuota
from benchmarks.simlib import workloads as wl
from tests.sim.conftest import make_sim


def placed(num_groups, quota):
    workload = wl.shared_prefix(num_groups=num_groups, prompts_per_group=3,
                                system_prompt_len=64, question_len=32, output_len=4,
                                rate_qps=2.0, passes=2)
    sim = make_sim(workload, num_replicas=len(quota))
    sim.router.policy = GroupQuota(quota)
    replica_of = {r.request_id: r.replica_id for r in sim.run().records}
    replicas_of = defaultdict(set)  # group -> the replicas its requests went to
    for item in workload.items:
        replicas_of[item.segments[0].key].add(replica_of[item.request_id])
    return replicas_of


def test_each_group_stays_on_one_replica_and_the_quota_sets_the_counts():
    replicas_of = placed(6, [1, 2, 3])
    assert all(len(r) == 1 for r in replicas_of.values())
    groups_on = defaultdict(int)
    for (rid,) in replicas_of.values():
        groups_on[rid] += 1
    assert sorted(groups_on.values()) == [1, 2, 3]


def test_more_groups_than_the_quota_is_an_error():
    with pytest.raises(RuntimeError, match="more groups than the quota"):
        placed(4, [1, 2])
