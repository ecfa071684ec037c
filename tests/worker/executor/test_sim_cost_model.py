"""The h100-llama3-8b cost model, step by step, against hand-computed figures.

Rates: 989e12 FLOP/s x MFU 0.5 = 4.945e14 FLOP/s; 3.35e12 B/s x MBU 0.7 = 2.345e12 B/s.
Reading the weights once (2 x 8.03e9 bytes) takes 6.8486 ms: the floor of every step.
"""

import math

import pytest

from kv.manager import CopyPlan
from protocol.engine import SampledToken, SampleFailure, SamplingParams
from worker.engine.step import ScheduledSeq, StepInput
from worker.executor.sim import PRESETS, SimExecutor, step_time_s

H100 = PRESETS["h100-llama3-8b"]
FLOPS = 989e12 * 0.5
HBM = 3.35e12 * 0.7
WEIGHTS_S = 2 * 8.03e9 / HBM


def step(*seqs, swap_in=()):
    return StepInput(list(seqs), CopyPlan([], list(swap_in)))


def seq(rid, num_new, start_pos, sample=True):
    return ScheduledSeq(rid, [7] * num_new, start_pos, [0], sample)


def test_a_small_decode_step_is_the_weight_read_plus_its_kv_read():
    # One request decoding at context 1000: 1000 tokens x 128 KiB of KV read.
    expected = 1e-3 + WEIGHTS_S + 131072 * 1000 / HBM
    assert step_time_s(H100, step(seq("a", 1, 999))) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(7.904e-3, rel=1e-3)


def test_a_2048_token_prefill_is_compute_bound_with_causal_attention():
    linear = 2 * 8.03e9 * 2048 / FLOPS  # 66.5 ms
    attention = 4 * 32 * 4096 * (2048 * 2049 // 2) / FLOPS  # 2.2 ms
    got = step_time_s(H100, step(seq("a", 2048, 0)))
    assert got == pytest.approx(1e-3 + linear + attention, rel=1e-12)
    assert got == pytest.approx(0.06974, rel=1e-3)  # ~29k prefill tokens/s


def test_a_chunk_after_cached_tokens_attends_to_them():
    # 128 new tokens after 1920 cached ones: each attends to 1920 + its causal prefix.
    # Under ~211 tokens the linear layers are bound by the weight read, not by FLOPs.
    context = 128 * 1920 + 128 * 129 // 2
    expected = 1e-3 + WEIGHTS_S + 4 * 32 * 4096 * context / FLOPS
    assert 2 * 8.03e9 * 128 / FLOPS < WEIGHTS_S < 2 * 8.03e9 * 212 / FLOPS
    assert step_time_s(H100, step(seq("a", 128, 1920, sample=False))) == pytest.approx(
        expected, rel=1e-12)


def test_host_tier_copies_cross_pcie():
    base = step_time_s(H100, step(seq("a", 1, 99)))
    with_copies = step_time_s(H100, step(seq("a", 1, 99), swap_in=[(0, 1), (1, 2), (2, 3)]),
                              block_size=16)
    assert with_copies - base == pytest.approx(3 * 131072 * 16 / 50e9, rel=1e-9)  # 126 us


def test_the_executor_reports_the_time_without_sleeping_off_line():
    ex = SimExecutor("h100-llama3-8b", realtime=False, block_size=32)
    s = step(seq("a", 1, 99), swap_in=[(0, 1)])
    tokens = ex.execute(s, {})
    assert ex.last_step_time_s == step_time_s(H100, s, block_size=32)
    assert tokens == {"a": SampledToken(ex._token("a", 100))}


def test_sim_logprobs_are_consistent_and_min_tokens_keeps_stop_tokens_out():
    ex = SimExecutor("tiny", realtime=False, vocab_size=10, first_token_id=2)
    s = step(seq("a", 1, 0))
    natural = ex.execute(s, {})["a"].token_id
    asked = SamplingParams(logprobs=3, stop_token_ids=(natural,), min_tokens=1)
    out = ex.execute(s, {"a": asked})["a"]
    assert out.token_id != natural  # a stop token is not sampled before min_tokens
    lp = out.logprobs
    assert lp.token_id == out.token_id and lp.top[0] == (out.token_id, lp.logprob)
    assert [t for t, _ in lp.top] == [out.token_id, 2 + (out.token_id - 1) % 8,
                                      2 + out.token_id % 8]
    assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
    assert sum(math.exp(v) for _, v in lp.top) < 1
    assert ex.execute(s, {"a": SamplingParams()})["a"].logprobs is None


def test_a_request_that_bans_every_token_fails_alone_instead_of_looping_forever():
    ex = SimExecutor("tiny", realtime=False, vocab_size=10, first_token_id=2,
                     eos_token_ids=(2,))
    s = step(seq("a", 1, 0), seq("b", 1, 0))
    banned = SamplingParams(stop_token_ids=tuple(range(3, 10)), min_tokens=1)
    out = ex.execute(s, {"a": banned, "b": SamplingParams()})
    assert out["a"] == SampleFailure("sampling failed: every token is masked")
    assert out["b"] == SampledToken(ex._token("b", 1))
