"""Simulated gateways list the replicas by the live routers' rule (router/core/candidates.py):
router "gateway-i" of G at its rank by id among them, so with 12 "gateway-10" and
"gateway-11" rank before "gateway-2"."""

import dataclasses

from benchmarks.simlib.cluster import ClusterSim
from benchmarks.simlib.workloads import Segment, WorkItem, Workload
from tests.sim.conftest import make_sim


def test_twelve_gateways_tie_on_the_replica_of_their_rank_by_id():
    # twelve unrelated prompts at once, request k through gateway k (round robin): each
    # gateway sees an idle, empty cluster and takes its first listed replica
    names = [f"q{k:02d}" for k in range(12)]
    w = Workload("dozen", tuple(WorkItem(n, 0.0, (Segment(n, 64),), 4) for n in names))
    config = dataclasses.replace(make_sim(w, num_replicas=12).config, num_routers=12,
                                 router_spread="round_robin", rotate_candidates=True)
    routes = {r.request_id: r.replica_id for r in ClusterSim(config, w).run().records}
    by_id = sorted(f"gateway-{k}" for k in range(12))  # rank i of 12 lists from r<i>
    assert routes == {n: f"r{by_id.index(f'gateway-{k}')}" for k, n in enumerate(names)}
    assert [routes[n] for n in names[:4]] == ["r0", "r1", "r4", "r5"]
