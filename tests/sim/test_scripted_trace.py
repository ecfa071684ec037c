"""A four-request script whose routing and hits are computed by hand.

Two replicas, block size 16, preset `tiny` (a step takes about a millisecond), router
load_weight 0.5, outstanding work only (cached_load_fraction 0, no recent-work memory; the
defaults' own script is test_default_load_model_by_hand below). Prompts are 80 tokens: a
64-token system prompt (4 blocks) + a 16-token question (1 block).

    t       request  prompt     max_tokens
    0       A        S + a      2     finishes within ~2 ms; its events reach the router
                                      at the next publish tick (0.05 s) + 10 ms
    1.000   B        S + b      100
    1.001   C        S + c      100   B still runs (100 decode steps)
    1.002   D        T + d      100

cache_aware: A ties everywhere (load 0, no match, no work routed yet) -> r0. B: r0 holds
S, cost 16 + 0.5 x 0 < 80 -> r0, 64 hit tokens. C: r0 load = B's 16 + 100 = 116 tokens,
cost 16 + 58 = 74 < 80 on r1 -> r0, 64 hit tokens. D: nobody holds T; r0 load 232 -> cost
80 + 116 = 196 > 80 on r1 -> r1, no hit. Approximate mode decides the same from its routed
history (A's blocks on r0). round_robin: r0, r1, r0, r1; only C lands where S is cached.
The pooled bound (one cache) hits S for B and C: 128 of 320 prompt tokens.
"""

import pytest

from benchmarks.simlib.workloads import Segment, WorkItem, Workload
from tests.sim.conftest import make_sim


def script() -> Workload:
    def item(rid, t, prefix, question, max_tokens):
        return WorkItem(rid, t, (Segment(prefix, 64), Segment(question, 16)), max_tokens)

    return Workload("script", (item("A", 0.0, "S", "a", 2), item("B", 1.0, "S", "b", 100),
                               item("C", 1.001, "S", "c", 100),
                               item("D", 1.002, "T", "d", 100)))


@pytest.mark.parametrize("policy, approximate, routes, hits", [
    ("cache_aware", False, ["r0", "r0", "r0", "r1"], [0, 64, 64, 0]),
    ("cache_aware", True, ["r0", "r0", "r0", "r1"], [0, 64, 64, 0]),
    ("round_robin", False, ["r0", "r1", "r0", "r1"], [0, 0, 64, 0]),
])
def test_routes_and_hits_match_the_hand_computation(policy, approximate, routes, hits):
    sim = make_sim(script(), num_replicas=2, policy=policy, approximate=approximate,
                   load_weight=0.5, cached_load_fraction=0.0, recent_work_half_life_s=0.0)
    run = sim.run()
    recs = {r.request_id: r for r in run.records}
    assert [recs[k].replica_id for k in "ABCD"] == routes
    assert [recs[k].cached_device_tokens for k in "ABCD"] == hits
    assert [recs[k].cached_host_tokens for k in "ABCD"] == [0, 0, 0, 0]
    assert [recs[k].predicted_hit_tokens for k in "ABCD"] == hits
    assert [recs[k].num_output_tokens for k in "ABCD"] == [2, 100, 100, 100]
    assert run.pooled.hit_tokens == 128 and run.pooled.query_tokens == 320


def test_default_load_model_by_hand():
    """The same script with the default load model (load_weight 0.5 kept). A, before any
    output is known, is charged its max_tokens: it adds 80 + 2 = 82 tokens of recent work
    to r0, 80.1 a second later (half-life 30 s), and ends with 2 tokens: the mean output.
    B: r0 costs 16 + 0.5 x 80.1 = 56 < 80 -> r0, and adds 16 + 0.1 x 64 + min(100, 2) =
    24.4 (not 100 decode tokens: what requests here produce). C: r0's load is its recent
    work, 80.1 + 24.4 = 104.5: 16 + 52.3 < 80 -> r0 (a hit). D: nobody holds T, r0 carries
    128.9, r1 nothing: 80 + 64.5 > 80 -> r1."""
    sim = make_sim(script(), num_replicas=2, load_weight=0.5)
    recs = {r.request_id: r for r in sim.run().records}
    assert [recs[k].replica_id for k in "ABCD"] == ["r0", "r0", "r0", "r1"]
    assert [recs[k].cached_device_tokens for k in "ABCD"] == [0, 64, 64, 0]


def test_the_router_index_holds_what_the_replicas_hold_once_events_arrive():
    sim = make_sim(script(), num_replicas=2)
    run = sim.run()  # ends when the last event batch is delivered
    for rep in run.replicas:
        assert sim.router.index.blocks_of(rep.replica_id) == frozenset(rep.core.kv.pool.cached)
    assert sim.num_snapshots == 0  # in-order delivery never opens a gap
