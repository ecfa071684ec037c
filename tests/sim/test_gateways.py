"""Several simulated gateways: which one each request meets, and the pending marks they
share.

The script for sharing: two replicas, two gateways taking requests in turn (round robin),
prompts of a 128-token prefix + a 16-token question, everything routed before the first
events reach any router (publish tick 0.05 s + 10 ms).

    t       gateway  request  prompt
    0       0        A        P + a     ties -> r0
    0.001   1        B        Q + b     gateway 1 knows nothing: ties -> r0
    0.002   0        C        R + c     gateway 0 counts A on r0 -> r1
    0.003   1        A2       P + a2    without sharing, gateway 1 counts only B (on r0)
                                        -> r1, where P is not; with A's marks shared
                                        (they arrive at 0.0005), P is pending on r0 and
                                        saves 128 tokens there -> r0, behind A: 128 hit
"""

import dataclasses

import pytest

from benchmarks.simlib import workloads as wl
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim
from benchmarks.simlib.workloads import Segment, WorkItem, Workload
from router.core.candidates import router_offset
from tests.sim.conftest import make_sim


def script() -> Workload:
    def item(rid, t, prefix, question):
        return WorkItem(rid, t, (Segment(prefix, 128), Segment(question, 16)), 4)

    return Workload("gateways", (item("A", 0.0, "P", "a"), item("B", 0.001, "Q", "b"),
                                 item("C", 0.002, "R", "c"), item("A2", 0.003, "P", "a2")))


def run(workload, num_routers, spread="round_robin", share_pending_delay_s=None,
        share_work=False, **kw):
    config = make_sim(workload, **kw).config
    sim = ClusterSim(dataclasses.replace(
        config, num_routers=num_routers, router_spread=spread,
        share_pending_delay_s=share_pending_delay_s, share_work=share_work), workload)
    return sim, sim.run()


def routes_and_hits(result):
    return ({r.request_id: r.replica_id for r in result.records},
            {r.request_id: r.cached_device_tokens for r in result.records})


def test_a_gateway_that_hears_the_others_marks_follows_their_prefix():
    sim, alone = run(script(), 2)
    assert routes_and_hits(alone) == ({"A": "r0", "B": "r0", "C": "r1", "A2": "r1"},
                                      {"A": 0, "B": 0, "C": 0, "A2": 0})
    assert (alone.num_shared_routes, alone.num_shared_blocks) == (0, 0)
    sim, shared = run(script(), 2, share_pending_delay_s=0.0005)
    assert routes_and_hits(shared) == ({"A": "r0", "B": "r0", "C": "r1", "A2": "r0"},
                                       {"A": 0, "B": 0, "C": 0, "A2": 128})
    # every request shared its 9 blocks, and the other router marked them all (nothing was
    # confirmed anywhere yet)
    assert (shared.num_shared_routes, shared.num_shared_blocks,
            shared.num_marked_blocks) == (4, 36, 36)
    # one gateway (which also counts B's load, so sends B to r1) puts A2 behind A too
    routes, hits = routes_and_hits(run(script(), 1)[1])
    assert (routes["A2"], hits["A2"]) == ("r0", 128)
    for router in sim.routers:
        router.check_invariants()


def test_sharing_with_one_gateway_changes_nothing():
    w = wl.generated_shared_prefix(num_groups=6, prompts_per_group=4, system_prompt_len=128,
                                   question_len=16, output_len=6, rate_qps=40.0, seed=0)
    _, plain = run(w, 1, num_replicas=3)
    _, shared = run(w, 1, share_pending_delay_s=0.0, num_replicas=3)
    assert routes_and_hits(plain) == routes_and_hits(shared)
    assert [r.finish_s for r in plain.records] == [r.finish_s for r in shared.records]
    assert shared.num_shared_routes == 0


def test_round_robin_takes_turns_and_session_keeps_a_conversation_on_its_gateway():
    w = wl.multi_turn(num_clients=3, num_rounds=3, rate_qps=50.0, output_len=4, seed=0)
    for spread in ("round_robin", "session"):
        sim, result = run(w, 2, spread, num_replicas=2)
        gateway_of = sim.gateways._gateway_of
        order = [r.request_id for r in result.records]  # in arrival order
        if spread == "round_robin":
            assert [gateway_of[rid] for rid in order] == [n % 2 for n in range(len(order))]
        else:
            firsts = [it.request_id for it in w.items if it.parent_id is None]
            first_order = [rid for rid in order if rid in firsts]
            assert [gateway_of[rid] for rid in first_order] == [0, 1, 0]
            for it in w.items:
                if it.parent_id is not None:
                    assert gateway_of[it.request_id] == gateway_of[it.parent_id]
        for router in sim.routers:  # each finished what it routed
            assert all(router.loads.num_outstanding(r) == 0 for r in sim.replica_ids)


@pytest.mark.parametrize("field, value, message", [
    ("router_spread", "hash", "router_spread must be one of random, round_robin, session"),
    ("share_pending_delay_s", -0.001, "share_pending_delay_s must be finite and >= 0"),
    ("share_pending_delay_s", float("nan"), "share_pending_delay_s must be finite and >= 0"),
    ("offset_by_id", True, "offset_by_id needs rotate_candidates"),
])
def test_bad_gateway_settings_are_refused(field, value, message):
    config = make_sim(script()).config
    with pytest.raises(ValueError, match=message):
        ClusterConfig(**{**{f.name: getattr(config, f.name)
                            for f in dataclasses.fields(config)}, field: value})


def test_a_gateway_that_hears_the_others_routed_work_spreads_as_one_would():
    # B: gateway 1 counts A's work on r0 (shared at 0.0005) and, with no cached prefix
    # anywhere, takes the idle r1, as one gateway does. C finds equal costs on r0 and r1
    # at gateway 0, which breaks the tie by the work its own policy routed (A, on r0) and
    # so takes r1; one gateway's policy routed both and breaks it the other way.
    sim, shared = run(script(), 2, share_pending_delay_s=0.0005, share_work=True)
    routes, hits = routes_and_hits(shared)
    assert routes == {"A": "r0", "B": "r1", "C": "r1", "A2": "r0"}
    assert hits == {"A": 0, "B": 0, "C": 0, "A2": 128}
    one_routes, _ = routes_and_hits(run(script(), 1)[1])
    assert one_routes == {"A": "r0", "B": "r1", "C": "r0", "A2": "r0"}
    for router in sim.routers:  # every router saw every request end
        assert all(router.loads.num_outstanding(r) == 0 for r in sim.replica_ids)
        router.check_invariants()


def test_routers_that_know_nothing_of_each_other_tie_on_their_own_replica_when_rotated():
    # two unrelated prompts at once through two gateways: each gateway sees an idle,
    # empty cluster and takes its first listed replica
    w = Workload("pair", tuple(WorkItem(rid, 0.0, (Segment(rid, 64),), 4) for rid in "AB"))
    for rotate, routes in [(False, {"A": "r0", "B": "r0"}), (True, {"A": "r0", "B": "r1"})]:
        config = make_sim(w).config
        sim = ClusterSim(dataclasses.replace(config, num_routers=2, router_spread="round_robin",
                                             rotate_candidates=rotate), w)
        assert routes_and_hits(sim.run())[0] == routes


def test_routers_rotated_by_their_ids_list_from_their_hashed_offsets():
    # gateway-0 and gateway-1 both hash to offset 1 of two replicas (router_offset): a
    # shared offset, so both ties fall on r1, where the even offsets split them
    assert [router_offset(f"gateway-{i}") % 2 for i in range(2)] == [1, 1]
    w = Workload("pair", tuple(WorkItem(rid, 0.0, (Segment(rid, 64),), 4) for rid in "AB"))
    config = dataclasses.replace(make_sim(w).config, num_routers=2,
                                 router_spread="round_robin", rotate_candidates=True,
                                 offset_by_id=True)
    assert routes_and_hits(ClusterSim(config, w).run())[0] == {"A": "r1", "B": "r1"}
