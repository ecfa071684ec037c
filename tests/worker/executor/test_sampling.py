import pytest
import torch

from protocol.engine import EngineInputError, SampledToken, SampleFailure, SamplingParams
from worker.executor.sampling import Sampler, suppressed_token_ids


def logits(rows=1, vocab=10, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def test_greedy_is_argmax():
    x = logits(3)
    out = Sampler().sample(x, ["a", "b", "c"], [SamplingParams(temperature=0)] * 3)
    assert out == x.argmax(-1).tolist()


def test_same_seed_same_tokens_regardless_of_batch():
    x = logits(2, 50)
    sp = SamplingParams(temperature=1.0, seed=42)
    alone = [Sampler().sample(x[:1], ["a"], [sp])[0] for _ in range(2)]
    s = Sampler()
    seq_a = [s.sample(x, ["a", "b"], [sp, SamplingParams(temperature=1.0)])[0]
             for _ in range(5)]
    s2 = Sampler()
    seq_b = [s2.sample(x[:1], ["a"], [sp])[0] for _ in range(5)]
    assert alone[0] == alone[1] == seq_a[0]
    assert seq_a == seq_b
    assert len(set(seq_a)) > 1  # the generator advances: not the same token every step


def test_top_k_1_and_tiny_top_p_are_greedy():
    x = logits(1, 100, seed=3)
    s = Sampler()
    best = int(x.argmax())
    for _ in range(20):
        assert s.sample(x, ["k"], [SamplingParams(temperature=2.0, top_k=1)]) == [best]
        assert s.sample(x, ["p"], [SamplingParams(temperature=2.0, top_p=1e-6)]) == [best]


def test_top_k_restricts_support():
    x = logits(1, 100, seed=4)
    allowed = set(torch.topk(x[0], 5).indices.tolist())
    s = Sampler()
    seen = {s.sample(x, ["k"], [SamplingParams(temperature=5.0, top_k=5, seed=1)])[0]
            for _ in range(200)}
    assert seen <= allowed and len(seen) > 1


@pytest.mark.parametrize("kw, field", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-1), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_k=-2), "top_k"),
    (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(seed="x"), "seed"),
    (dict(stop_token_ids=(-1,)), "stop_token_ids"), (dict(stop=("",)), "stop"),
])
def test_bad_sampling_parameters_are_clear_errors(kw, field):
    with pytest.raises(EngineInputError, match=field):
        SamplingParams(**kw)


def test_logprobs_are_the_raw_distribution_with_the_top_k_most_likely_first():
    x = logits(2, 30, seed=5)
    params = [SamplingParams(temperature=0.7, logprobs=3), SamplingParams(temperature=0)]
    tokens = [4, int(x[1].argmax())]
    out = Sampler.logprobs(x, tokens, params)
    expected = torch.log_softmax(x[0], dim=-1)
    assert out[1] is None  # that row did not ask
    assert out[0].token_id == 4
    assert out[0].logprob == pytest.approx(float(expected[4]))
    top_ids = torch.argsort(expected, descending=True)[:3].tolist()
    assert [t for t, _ in out[0].top] == top_ids
    assert [lp for _, lp in out[0].top] == pytest.approx(expected[top_ids].tolist())


def test_logprobs_zero_gives_the_sampled_token_only():
    x = logits(1, 10, seed=6)
    (out,) = Sampler.logprobs(x, [2], [SamplingParams(logprobs=0)])
    assert out.top == () and out.logprob == pytest.approx(float(torch.log_softmax(x[0], -1)[2]))


def test_suppressed_tokens_are_never_sampled_and_only_below_min_tokens():
    x = torch.zeros(1, 4)
    x[0, 2] = 50.0  # token 2 (the "EOS") is by far the most likely
    s = Sampler()
    sp = SamplingParams(temperature=1.0, min_tokens=3, stop_token_ids=(3,))
    assert suppressed_token_ids(sp, 2, (2,)) == (3, 2)
    assert suppressed_token_ids(sp, 3, (2,)) == ()
    assert suppressed_token_ids(SamplingParams(min_tokens=3, ignore_eos=True), 0, (2,)) == ()
    for _ in range(20):
        assert s.sample(x, ["a"], [sp], [(3, 2)])[0] in (0, 1)
    assert s.sample(x, ["g"], [SamplingParams(temperature=0)], [(2,)]) == [0]
    assert s.sample(x, ["g"], [SamplingParams(temperature=0)], [()]) == [2]


def test_a_row_that_cannot_be_sampled_fails_alone():
    x = logits(4, 10, seed=5)
    x[1] = float("nan")  # a row of NaN logits
    greedy, seeded = SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=3)
    out = Sampler().sample_step(x, ["a", "nan", "masked", "oov"], [greedy, seeded, seeded, greedy],
                                [(), (), tuple(range(10)), (10,)])
    assert out["a"] == SampledToken(int(x[0].argmax()))
    assert [type(out[r]) for r in ("nan", "masked", "oov")] == [SampleFailure] * 3
    assert out["masked"].error.startswith("sampling failed: no token can be sampled")
    assert "out of" in out["oov"].error  # the index error names the bad id


def test_min_p_drops_tokens_less_likely_than_its_share_of_the_best():
    x = torch.tensor([[4.0, 3.9, 0.0, -1.0]])  # p ~ [0.52, 0.47, 0.01, 0.004]
    s = Sampler()
    drawn = {s.sample(x, ["m"], [SamplingParams(temperature=1.0, min_p=0.1, seed=1)])[0]
             for _ in range(200)}
    assert drawn == {0, 1}
    with pytest.raises(EngineInputError, match="min_p"):
        SamplingParams(min_p=1.5)


def test_a_near_zero_temperature_is_greedy_not_a_failure():
    x = logits(2, 50, seed=9)
    out = Sampler().sample(x, ["a", "b"], [SamplingParams(temperature=5e-321),
                                           SamplingParams(temperature=1e-30, seed=1)])
    assert out == x.argmax(-1).tolist()
