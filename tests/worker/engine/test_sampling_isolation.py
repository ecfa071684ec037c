"""One request's sampling cannot fail the engine step of everyone else.

The reproducer: an out-of-vocabulary stop token id with min_tokens raised IndexError in the
sampler, which failed the whole step: another request's stream ended with "engine step
failed", and three such requests made the replica unhealthy."""

import dataclasses

import pytest

from protocol.engine import EngineInputError, EngineRequest, SamplingParams
from tests.worker.engine.test_engine_sim import collect, make_engine, prompt


async def test_an_out_of_vocabulary_stop_token_id_is_refused_and_the_victim_is_served():
    engine = make_engine(engine="real", num_blocks=32)
    vocab = engine.executor.vocab_size
    victim = engine.generate(EngineRequest("victim", prompt(20), SamplingParams(
        max_tokens=12, temperature=0, ignore_eos=True)))
    first = await anext(victim)  # the victim is running when the hostile request comes
    with pytest.raises(EngineInputError, match=rf"stop_token_ids must be in \[0, {vocab}\)"):
        await collect(engine, EngineRequest("hostile", prompt(8), SamplingParams(
            max_tokens=4, min_tokens=2, stop_token_ids=(vocab + 1000,))))
    rest = [d async for d in victim]
    assert [d.finish_reason for d in rest][-1] == "length"
    assert len(first.token_ids) + sum(len(d.token_ids) for d in rest) == 12
    engine.check_health(max_failed_steps=1)
    await engine.shutdown()


async def test_a_request_whose_sampling_fails_ends_alone_and_the_step_goes_on():
    """Defence in depth: a bad parameter that got past every check (set on the admitted
    request here, as no public path can any more) fails its own request only."""
    engine = make_engine(engine="real", num_blocks=32)
    vocab = engine.executor.vocab_size
    victim = engine.generate(EngineRequest("victim", prompt(20), SamplingParams(
        max_tokens=30, temperature=0, ignore_eos=True)))
    first = await anext(victim)
    hostile = engine.generate(EngineRequest("hostile", prompt(8), SamplingParams(
        max_tokens=50, min_tokens=40, stop_token_ids=(5,))))
    await anext(hostile)  # short of min_tokens: the next steps mask its stop token ids
    req = engine.core.scheduler.requests["hostile"]
    req.sampling = dataclasses.replace(req.sampling, stop_token_ids=(vocab + 1000,))
    ended = [d async for d in hostile][-1]
    assert ended.finish_reason == "error"
    assert ended.error.startswith("sampling failed: ")
    rest = [d async for d in victim]
    assert rest[-1].finish_reason == "length"
    assert len(first.token_ids) + sum(len(d.token_ids) for d in rest) == 30
    assert engine._num_failed_steps == 0
    engine.check_health(max_failed_steps=1)
    await engine.shutdown()
