"""worker/openai/choices.py on a simulated engine in this process: a prompt's copies, started
together, compute it once (the rest hit its blocks), a refused choice closes the others,
usage counts each prompt once."""

import pytest

from protocol.engine import EngineInputError, EngineRequest, SamplingParams, Usage
from worker.engine.config import EngineConfig
from worker.engine.factory import build_engine
from worker.openai.choices import Choices, collect, total_usage


def make_engine():
    return build_engine(EngineConfig(model="tiny", engine="sim", sim_preset="tiny",
                                     num_blocks=64, block_size=16))


def requests(prompt, n, max_tokens=4, base="r"):
    return [EngineRequest(f"{base}-{i}", prompt, SamplingParams(max_tokens=max_tokens))
            for i in range(n)]


async def test_copies_started_together_hit_the_prompt_blocks_one_of_them_computes():
    engine = make_engine()
    prompt = list(range(10, 60))  # 50 tokens: 3 full blocks of 16
    choices = Choices(requests(prompt, 3), 3, engine.generate)
    await choices.start()
    outputs = await collect(choices)
    assert [o.finish_reason for o in outputs] == ["length"] * 3
    assert [o.usage.cached_tokens_device for o in outputs] == [0, 48, 48]
    assert total_usage([o.usage for o in outputs], 3) == Usage(50, 12, 0, 0)
    assert not engine.core.scheduler.requests
    await engine.shutdown()


async def test_a_batch_starts_each_prompt_and_keeps_choice_order():
    engine = make_engine()
    batch = requests([1, 2, 3], 2, 2, "a") + requests(list(range(40, 45)), 2, 3, "b")
    choices = Choices(batch, 2, engine.generate)
    await choices.start()
    outputs = await collect(choices)
    assert [o.usage.completion_tokens for o in outputs] == [2, 2, 3, 3]
    assert total_usage([o.usage for o in outputs], 2) == Usage(3 + 5, 10, 0, 0)
    await engine.shutdown()


def test_usage_counts_each_prompt_once_with_its_hits_from_before_the_request():
    a_first, a_copy = Usage(50, 4, 0, 0), Usage(50, 4, 48, 0)
    b_cached, b_copy = Usage(20, 2, 16, 0), Usage(20, 3, 16, 0)
    assert total_usage([a_copy, a_first, b_cached, b_copy], 2) == Usage(70, 13, 16, 0)
    assert total_usage([a_first, None], 2) is None


async def test_a_refused_choice_fails_the_start_and_aborts_the_others():
    engine = make_engine()
    good = requests(list(range(20)), 1, 200)
    bad = [EngineRequest("bad", [10**6], SamplingParams())]  # outside the vocabulary
    choices = Choices(good + bad, 1, engine.generate)
    with pytest.raises(EngineInputError):
        await choices.start()
    assert not engine.core.scheduler.requests  # the running choice was aborted
    await engine.shutdown()
