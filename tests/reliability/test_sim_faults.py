"""Fault injection on the simulator at 16-64 replicas: after replicas die and
event batches are dropped, duplicated, delayed and reordered, every request ended clearly,
the router's index equals what the live replicas hold after one clean publish, and the
router's outstanding load and held marks are back to zero."""

import pytest

from benchmarks.simlib import workloads as wl
from tests.reliability.sim_faults import CLEAR_ENDS, make_faulty


@pytest.mark.parametrize("num_replicas, seed", [(16, 0), (16, 1), (64, 2)])
def test_sim_cluster_survives_kills_and_a_faulty_event_feed(num_replicas, seed):
    workload = wl.generated_shared_prefix(num_groups=num_replicas, prompts_per_group=6,
                                          system_prompt_len=256, question_len=32,
                                          output_len=8, rate_qps=400.0, seed=seed)
    span_s = workload.items[-1].arrival_s
    kills = tuple((span_s * f, k) for f, k in ((0.3, 1), (0.5, 2), (0.7, num_replicas - 1)))
    sim = make_faulty(workload, num_replicas, seed, kills=kills)
    run = sim.run()

    assert len(sim.dead) == 3
    assert sim.num_dropped and sim.num_duplicated and sim.num_delayed  # the faults happened
    ends = [r.finish_reason for r in run.records]
    assert all(r.finish_s is not None for r in run.records), "a request hung"
    assert set(ends) <= CLEAR_ENDS
    assert ends.count("error") == sim.num_failed_by_kill
    assert ends.count("length") == len(ends) - sim.num_failed_by_kill
    dead_ids = {sim.replicas[i].replica_id for i in sim.dead}
    assert not dead_ids & set(sim.router.index.replica_ids), "a dead replica reappeared"
    assert sim.leaked() == (0, 0)
    sim.heal()
    assert sim.divergent_replicas() == []
    for rep in run.replicas:
        rep.core.scheduler.check_invariants()
