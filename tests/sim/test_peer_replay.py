"""The simulator's parts for bench_peers.py and sim_vs_live.py: answers that do not
re-encode, stretched steps, the replay of live prompts, miss classes, mooncake families."""

import dataclasses
import json

import pytest

from benchmarks import sim_vs_live
from benchmarks.simlib import workloads as wl
from benchmarks.simlib.cluster import ClusterSim
from benchmarks.simlib.miss_classes import run_with_miss_classes
from tests.sim.conftest import make_sim


def two_turns():
    # one client, 2 rounds: 64 new tokens each, 32 out (2 blocks of answer)
    return wl.multi_turn(num_clients=1, num_rounds=2, request_len=64, output_len=32,
                         rate_qps=100.0)


def with_config(sim, **changes):
    sim.config = dataclasses.replace(sim.config, **changes)
    return sim


def test_an_answer_that_does_not_reencode_is_recomputed_as_prompt():
    same = {r.request_id: r for r in make_sim(two_turns(), num_replicas=1).run().records}
    other = {r.request_id: r for r in with_config(make_sim(two_turns(), num_replicas=1),
                                                  answers_reencode=False).run().records}
    # round 1 resends 64 prompt + 32 answer tokens: when the answer re-encodes, 5 blocks
    # come from cache (the answer's last token was sampled, never computed, so its block
    # was not full); otherwise only the 4 prompt blocks do
    assert same["mt-c0-r1"].cached_device_tokens == 80
    assert other["mt-c0-r1"].cached_device_tokens == 64
    assert other["mt-c0-r1"].num_prompt_tokens == same["mt-c0-r1"].num_prompt_tokens == 160


def test_step_time_scale_stretches_every_step():
    w = wl.generated_shared_prefix(2, 2, 64, 16, 4, seed=0)
    base = make_sim(w).run()
    sim = make_sim(w)
    for rep in sim.replicas:
        rep.config = dataclasses.replace(rep.config, step_time_scale=3.0)
    slow = sim.run()
    assert [r.busy_s for r in slow.replicas] == pytest.approx(
        [3.0 * r.busy_s for r in base.replicas], rel=1e-12)


def test_miss_classes_name_the_never_seen_and_the_evicted():
    # 3 distinct 64-token prompts then the first again, on one replica of 8 blocks:
    # prompt 0's 4 blocks are evicted by prompts 1 and 2 before it comes back
    items = tuple(wl.WorkItem(f"r{i}", float(i), (wl.Segment(f"p{k}", 64),), 1)
                  for i, k in enumerate((0, 1, 2, 0)))
    run, shares = run_with_miss_classes(make_sim(wl.Workload("t", items), num_replicas=1,
                                                 num_blocks=8))
    total = sum(r.num_prompt_tokens for r in run.records)
    assert [r.cached_device_tokens for r in run.records] == [0, 0, 0, 0]
    assert shares["never_seen"] * total == 3 * 64
    assert shares["evicted_everywhere"] * total == 64
    assert sum(shares.values()) * total == 4 * 64


def test_a_replay_sends_the_live_prompts_at_their_live_times(tmp_path):
    summary = {"workload": "t", "router": "kvroute_events", "seed": 1, "num_workers": 2,
               "num_blocks": 64, "max_num_seqs": 8, "max_num_batched_tokens": 512,
               "sim_preset": "tiny", "cached_token_rate": 0.0, "bound_hit_rate": 0.0,
               "tpot_mean_s": 0.01}
    text = "".join(chr(40 + i % 50) for i in range(100))
    records = [{"request_id": f"q{i}", "sent_s": 0.5 * i, "prompt": text,
                "completion_tokens": 4} for i in range(3)]
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [summary, *records]) + "\n")
    loaded_summary, loaded = sim_vs_live.load_run(path)
    run = sim_vs_live.replay(loaded_summary, loaded)
    assert [r.arrival_s for r in run.records] == [0.0, 0.5, 1.0]
    assert {r.num_prompt_tokens for r in run.records} == {101}  # <s> + 100 bytes
    # the same prompt again: all its 6 full blocks come from cache on the replica it went to
    assert [r.cached_device_tokens for r in run.records] == [0, 96, 96]


def test_mooncake_families_keep_every_request_of_a_kept_first_block(tmp_path):
    rows = [(0, [1, 2]), (1000, [2, 3]), (2000, [1, 2, 5]), (3000, [3])]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps({"timestamp": t, "input_length": 512 * len(ids),
                                          "output_length": 4, "hash_ids": ids})
                              for t, ids in rows) + "\n")
    w = wl.mooncake(path, family_modulus=2, family_residue=1)
    assert [it.request_id for it in w.items] == ["mc-0", "mc-2", "mc-3"]
    assert [it.arrival_s for it in w.items] == [0.0, 2.0, 3.0]
    assert [it.request_id for it in wl.mooncake(path).items] == [f"mc-{n}" for n in range(4)]


def test_two_routers_each_keep_their_own_marks_and_see_one_event_feed():
    w = wl.generated_shared_prefix(num_groups=6, prompts_per_group=4, system_prompt_len=128,
                                   question_len=16, output_len=6, seed=0)

    def run(num_routers, approximate):
        config = make_sim(w, num_replicas=2, num_blocks=64, approximate=approximate).config
        sim = ClusterSim(dataclasses.replace(config, num_routers=num_routers), w)
        result = sim.run()
        hits = sum(r.cached_device_tokens for r in result.records)
        return sim, hits

    one_sim, one = run(1, True)
    two_sim, two = run(2, True)
    # each router finished what it routed, and both routed some
    for router in two_sim.routers:
        assert all(router.loads.num_outstanding(r) == 0 for r in two_sim.replica_ids)
    assert set(two_sim.gateways._gateway_of.values()) == {0, 1}
    # routed history split over two routers sends groups where the other router put them
    # less often: fewer hits than one router's
    assert two < one


def test_a_replay_routes_with_the_live_run_s_continuation_affinity(monkeypatch):
    seen = []

    class Spy(ClusterSim):
        def __init__(self, config, workload):
            seen.append(config.router.continuation_affinity)
            super().__init__(config, workload)

    monkeypatch.setattr(sim_vs_live, "ClusterSim", Spy)
    summary = {"workload": "t", "router": "kvroute_events", "num_workers": 2,
               "num_blocks": 64, "max_num_seqs": 8, "max_num_batched_tokens": 512,
               "sim_preset": "tiny"}
    records = [{"request_id": "q0", "sent_s": 0.0, "prompt": "hello", "completion_tokens": 2}]
    for recorded in ({"continuation_affinity": True}, {"continuation_affinity": False}, {}):
        sim_vs_live.replay({**summary, **recorded}, records)
    assert seen == [True, False, False]  # a run recorded before the setting had it off
