"""The simulated cluster: determinism, hits as kv/ counts them, load conservation."""

import dataclasses

import pytest

from benchmarks.simlib import workloads as wl
from benchmarks.simlib.cluster import ClusterSim
from tests.sim.conftest import make_sim


def outcome(run):
    recs = [(r.request_id, r.replica_id, r.arrival_s, r.first_token_s, r.finish_s,
             r.num_output_tokens, r.cached_device_tokens, r.cached_host_tokens,
             r.predicted_hit_tokens, r.num_preemptions) for r in run.records]
    reps = [(rep.num_steps, rep.num_tokens_computed, rep.busy_s) for rep in run.replicas]
    return recs, reps, run.pooled.hit_tokens, run.sim_duration_s


def grouped(rate_qps=40.0, seed=0):
    return wl.generated_shared_prefix(num_groups=6, prompts_per_group=4, system_prompt_len=128,
                                      question_len=16, output_len=6, rate_qps=rate_qps,
                                      seed=seed)


@pytest.mark.parametrize("policy, approximate", [("cache_aware", False),
                                                 ("cache_aware", True), ("random", False)])
def test_same_seed_same_run(policy, approximate):
    a = make_sim(grouped(), num_replicas=3, policy=policy, approximate=approximate).run()
    b = make_sim(grouped(), num_replicas=3, policy=policy, approximate=approximate).run()
    assert outcome(a) == outcome(b)


def test_another_seed_draws_other_tokens_and_arrivals():
    a = make_sim(grouped(seed=0), seed=0).run()
    b = make_sim(grouped(seed=1), seed=1).run()
    assert [r.arrival_s for r in a.records] != [r.arrival_s for r in b.records]


@pytest.mark.parametrize("policy", ["cache_aware", "round_robin"])
def test_hits_are_what_the_kv_managers_count_including_the_host_tier(policy):
    # 6 prefixes x 8 blocks do not fit 32 device blocks: evicted prefixes come back from
    # the host tier.
    run = make_sim(grouped(rate_qps=20.0), num_replicas=1, policy=policy, num_blocks=32,
                   host_blocks=128).run()
    rep = run.replicas[0]
    device = sum(r.cached_device_tokens for r in run.records)
    host = sum(r.cached_host_tokens for r in run.records)
    assert device == rep.core.kv.stats.device_hit_tokens > 0
    assert host == rep.core.kv.stats.host_hit_tokens > 0
    assert sum(r.num_prompt_tokens for r in run.records) == rep.core.kv.stats.query_tokens


def check_all_done_once(sim, run, workload):
    assert [r.request_id for r in sorted(run.records, key=lambda r: r.request_id)] == sorted(
        it.request_id for it in workload.items)
    by_id = {it.request_id: it for it in workload.items}
    for r in run.records:
        assert r.finish_reason == "length" and r.num_output_tokens == by_id[r.request_id].max_tokens
        assert r.arrival_s <= r.first_token_s <= r.finish_s
    for rep in run.replicas:
        assert not rep.core.scheduler.has_work and not rep.is_busy
        assert rep.core.kv.usage()["used"] == 0
        rep.core.scheduler.check_invariants()
    assert all(sim.router.loads.num_outstanding(rid) == 0 for rid in sim.replica_ids)
    sim.router.check_invariants()


def test_every_request_completes_exactly_once_and_work_is_conserved():
    workload = grouped(rate_qps=200.0)
    sim = make_sim(workload, num_replicas=3)
    run = sim.run()
    check_all_done_once(sim, run, workload)
    assert sum(r.num_preemptions for r in run.records) == 0
    # Without preemption each request computes its uncached prompt, then one token per
    # output token after the first (sampled at the end of its prefill).
    expected = sum(r.num_prompt_tokens - r.cached_device_tokens - r.cached_host_tokens
                   + r.num_output_tokens - 1 for r in run.records)
    assert sum(rep.num_tokens_computed for rep in run.replicas) == expected


def test_multi_turn_rounds_follow_their_history_through_preemption():
    # Up to 3 x 64 prompt + 2 x 48 history + 48 output = 336 tokens (21 blocks) a request,
    # 8 clients on 2 replicas of 40 blocks: requests outgrow the pool and get preempted.
    workload = wl.multi_turn(num_clients=8, num_rounds=3, request_len=64, output_len=48,
                             rate_qps=400.0)
    sim = make_sim(workload, num_replicas=2, num_blocks=40)
    run = sim.run()
    check_all_done_once(sim, run, workload)
    assert sum(r.num_preemptions for r in run.records) > 0
    recs = {r.request_id: r for r in run.records}
    for c in range(8):
        for r in (1, 2):
            prev, cur = recs[f"mt-c{c}-r{r - 1}"], recs[f"mt-c{c}-r{r}"]
            assert cur.arrival_s >= prev.finish_s
            assert cur.num_prompt_tokens == prev.num_prompt_tokens + 48 + 64


def test_a_prompt_longer_than_a_replica_is_rejected_and_its_round_still_ends_once():
    items = (wl.WorkItem("big", 0.0, (wl.Segment("x", 16 * 8),), 4),
             wl.WorkItem("ok", 0.0, (wl.Segment("y", 32),), 4))
    sim = make_sim(wl.Workload("w", items), num_replicas=2, num_blocks=8)
    recs = {r.request_id: r for r in sim.run().records}
    assert recs["big"].finish_reason == "rejected" and recs["big"].replica_id is None
    assert recs["ok"].finish_reason == "length"


@pytest.mark.parametrize("sent, routed", [
    ("workload_max", {"a": 9, "b": 9, "c": 9}),  # the default: a client's cap
    ("context", {"a": 8 * 16 - 32, "b": 8 * 16 - 48, "c": 8 * 16 - 32}),
    ("exact", {"a": 3, "b": 9, "c": 5})])
def test_the_router_sees_the_max_tokens_sent_and_the_answers_keep_their_length(sent, routed):
    items = (wl.WorkItem("a", 0.0, (wl.Segment("x", 32),), 3),
             wl.WorkItem("b", 0.0, (wl.Segment("y", 48),), 9),
             wl.WorkItem("c", 0.5, (wl.Segment("x", 32),), 5))
    workload = wl.Workload("w", items)
    sim = ClusterSim(dataclasses.replace(make_sim(workload, num_blocks=8).config,
                                         max_tokens_sent=sent), workload)
    seen = {}
    route = sim.router.route

    def spy(request_id, *args):
        seen[request_id] = args[3]
        return route(request_id, *args)

    sim.router.route = spy
    recs = {r.request_id: r for r in sim.run().records}
    assert seen == routed
    assert {k: r.max_tokens for k, r in recs.items()} == routed
    assert {k: r.num_output_tokens for k, r in recs.items()} == {"a": 3, "b": 9, "c": 5}


def test_an_unknown_max_tokens_sent_is_refused():
    config = make_sim(grouped()).config
    with pytest.raises(ValueError, match="max_tokens_sent"):
        dataclasses.replace(config, max_tokens_sent="oracle")
