"""Workload generators, deterministic tokens, prompt hashes, and the pooled LRU bound."""

import math

import numpy as np
import pytest

from benchmarks.simlib import workloads as wl
from benchmarks.simlib.conversation import conversation
from benchmarks.simlib.experiment import MOONCAKE_TRACE, saturation_index
from benchmarks.simlib.pooled import PooledLRU
from benchmarks.simlib.prompts import PromptBuilder, TokenSource
from kv.hashing import block_hashes, namespace_root

ROOT = namespace_root("sim")


def test_generated_shared_prefix_defaults_are_sglangs():
    w = wl.generated_shared_prefix()
    assert w.num_requests == 64 * 16
    assert {it.arrival_s for it in w.items} == {0.0}
    assert {tuple(s.num_tokens for s in it.segments) for it in w.items} == {(2048, 128)}
    assert {it.max_tokens for it in w.items} == {256}
    assert len({it.segments[0].key for it in w.items}) == 64
    assert [it.segments[0].key for it in w.items[:16]] != [w.items[0].segments[0].key] * 16


def test_shared_prefix_defaults_are_llm_ds_with_poisson_arrivals():
    w = wl.shared_prefix(rate_qps=10.0)
    assert w.num_requests == 3 * 150 * 5  # three passes over the prompt list
    assert {tuple(s.num_tokens for s in it.segments) for it in w.items} == {(6000, 1200)}
    assert {it.max_tokens for it in w.items} == {1000}
    times = np.array([it.arrival_s for it in w.items])
    assert times[0] == 0.0 and np.all(np.diff(times) > 0)
    assert abs((len(times) - 1) / times[-1] - 10.0) < 1.5  # ~10 req/s


def test_shared_prefix_resends_its_shuffled_prompt_list_as_inference_perf_does():
    w = wl.shared_prefix(num_groups=4, prompts_per_group=3, rate_qps=10.0, passes=2)
    prompts = [tuple(s.key for s in it.segments) for it in w.items]
    assert len(prompts) == 24 and len(set(prompts)) == 12
    assert prompts[:12] == prompts[12:]  # request n sends prompt n mod 12
    assert prompts[:12] != sorted(prompts[:12])  # shuffled
    assert len({it.request_id for it in w.items}) == 24
    with pytest.raises(ValueError, match="passes"):
        wl.shared_prefix(passes=0)


def test_multi_turn_rounds_continue_their_client():
    w = wl.multi_turn()
    assert w.num_requests == 256 * 5
    for it in w.items:
        c, r = it.request_id.split("-")[1:]
        assert it.parent_id == (f"mt-{c}-r{int(r[1:]) - 1}" if r != "r0" else None)
    first_round = [it.request_id for it in w.items[:256]]
    assert sorted(first_round) == sorted(f"mt-c{c}-r0" for c in range(256))
    assert first_round != [f"mt-c{c}-r0" for c in range(256)]  # clients in random order
    assert {it.num_new_prompt_tokens for it in w.items} == {512}
    assert {it.max_tokens for it in w.items} == {64}


def test_prefix_repetition_uses_ten_prefixes():
    w = wl.prefix_repetition()
    assert len({it.segments[0].key for it in w.items}) == 10
    assert {it.num_new_prompt_tokens for it in w.items} == {512}


def test_mooncake_trace_replays_with_its_block_ids_and_scaled_time():
    if not MOONCAKE_TRACE.exists():
        pytest.skip("the shared Mooncake trace is not here")
    w = wl.mooncake(MOONCAKE_TRACE, time_scale=2.0)
    assert w.num_requests == 3993
    first = w.items[0]
    assert first.num_new_prompt_tokens == 40160 and first.max_tokens == 6
    assert len(first.segments) == 79 and first.segments[-1].num_tokens == 40160 - 78 * 512
    assert first.segments[1].key == "mooncake/1"
    assert w.items[2].arrival_s == pytest.approx(0.040 / 2.0)


def test_a_workload_rejects_a_round_before_its_parent():
    item = wl.WorkItem("b", 0.0, (wl.Segment("x", 4),), 1, parent_id="a")
    with pytest.raises(ValueError, match="does not come before"):
        wl.Workload("w", (item,))


def test_tokens_are_deterministic_per_key_and_prefix_stable():
    a, b = TokenSource(seed=7), TokenSource(seed=7, shared_keys={"k"})
    long = a.tokens(wl.Segment("k", 512))
    assert np.array_equal(long[:100], b.tokens(wl.Segment("k", 100)))
    assert np.array_equal(long, b.tokens(wl.Segment("k", 512)))
    assert not np.array_equal(long, a.tokens(wl.Segment("j", 512)))
    assert not np.array_equal(long, TokenSource(seed=8).tokens(wl.Segment("k", 512)))
    assert long.min() >= 3 and long.max() < 32000


@pytest.mark.parametrize("lengths", [(64, 32), (64, 40, 24), (20, 64), (16, 16, 16)])
def test_prompt_hashes_are_the_whole_prompts_block_hashes(lengths):
    source = TokenSource(shared_keys={"s0", "s1", "s2"})
    builder = PromptBuilder(source, 16, ROOT)
    segs = [wl.Segment(f"s{i}", n) for i, n in enumerate(lengths)]
    for _ in range(2):  # the second build comes from the memo
        token_ids, hashes = builder.build(segs)
        assert len(token_ids) == sum(lengths)
        assert hashes == block_hashes(token_ids, 16, ROOT)
    history = token_ids + [5, 6, 7]
    more, more_hashes = builder.build([wl.Segment("s0", 30)], history,
                                      block_hashes(history, 16, ROOT))
    assert more[: len(history)] == history
    assert more_hashes == block_hashes(more, 16, ROOT)


def test_pooled_lru_hits_the_cached_head_and_evicts_tails_first():
    lru = PooledLRU(capacity_blocks=4, block_size=2)
    assert lru.serve_prompt([b"a", b"b", b"c"], 7) == 0
    assert lru.serve_prompt([b"a", b"b", b"x"], 6) == 4  # a, b hit; x is new
    # Cached tail first, so a is the most recent; oldest first: c, x, b, a.
    assert [h in lru for h in (b"a", b"b", b"c", b"x")] == [True, True, True, True]
    lru.release([b"y"])
    assert b"c" not in lru and len(lru) == 4
    assert lru.serve_prompt([b"a", b"b"], 4) == 3  # fully cached: the last token computes
    assert lru.hit_tokens == 7 and lru.query_tokens == 17


def test_saturation_is_the_first_rate_that_adds_under_five_percent():
    assert saturation_index([100.0, 200.0, 290.0, 300.0, 305.0]) == 3
    assert saturation_index([100.0, 200.0, 400.0]) is None
    assert saturation_index([100.0, 104.0]) == 1
    assert wl.poisson_arrivals_s(3, math.inf, 0).tolist() == [0.0, 0.0, 0.0]


def test_burst_sends_identical_prompts_then_prompts_differing_in_their_tail():
    w = wl.burst(num_prompts=5, prompt_len=64, tail_len=4, output_len=3, wave_gap_s=9.0)
    same, near = w.items[:5], w.items[5:]
    assert {(it.arrival_s, it.segments, it.max_tokens) for it in same} == {
        (0.0, (wl.Segment("burst/same", 64),), 3)}
    assert {it.arrival_s for it in near} == {9.0}
    assert {it.segments[0] for it in near} == {wl.Segment("burst/near", 60)}
    assert [it.segments[1] for it in near] == [wl.Segment(f"burst/tail{n}", 4)
                                               for n in range(5)]
    assert w.shared_keys() == {"burst/same", "burst/near"}
    with pytest.raises(ValueError, match="tail_len"):
        wl.burst(prompt_len=8, tail_len=8)


def test_conversation_sessions_grow_to_about_10k_tokens_after_think_times():
    w = conversation(rate_qps=1.0, duration_s=400.0)
    context: dict[str, int] = {}
    arrival: dict[str, float] = {}
    for it in w.items:
        if it.parent_id is None:
            assert it.segments[0] == wl.Segment("conversation/sys", 24) and it.think_s == 0
        else:
            assert it.think_s > 0 and len(it.segments) == 1
            assert it.arrival_s == arrival[it.parent_id] + it.think_s
        arrival[it.request_id] = it.arrival_s
        context[it.request_id] = (context.get(it.parent_id, 0) + it.num_new_prompt_tokens
                                  + it.max_tokens)
    assert w.shared_keys() == {"conversation/sys"}  # the head is all sessions share
    assert 9000 < max(context.values()) <= 10_000
    num_sessions = sum(it.parent_id is None for it in w.items)
    assert w.num_requests > 5 * num_sessions  # many turns a session
    assert 400 <= w.num_requests < 400 + 64  # rate x duration turns, whole sessions
    # the same sessions at a higher rate, and more of them
    more = conversation(rate_qps=2.0, duration_s=400.0)
    assert [it.segments for it in more.items[:50]] == [it.segments for it in w.items[:50]]
    assert more.num_requests >= 800
