"""Engine-level parity: greedy tokens through the whole engine (scheduler, KV manager,
prefix cache, chunked prefill, preemption, host tier) equal transformers' generate."""

import asyncio

import pytest
import torch

from protocol.engine import EngineRequest, SamplingParams
from tests.worker.model.model_harness import BLOCK_SIZE, CONFIGS, load_hf, prompt
from worker.engine.config import EngineConfig
from worker.engine.factory import build_engine
from worker.model.random_checkpoint import write_random_checkpoint

MAX_NEW = 6


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    write_random_checkpoint(path, CONFIGS[request.param], seed=3)
    return path


@pytest.fixture(scope="module")
def hf(checkpoint):
    model = load_hf(checkpoint)
    cache: dict[tuple, list[int]] = {}

    def generate(token_ids: list[int]) -> list[int]:
        key = tuple(token_ids)
        if key not in cache:
            with torch.no_grad():
                out = model.generate(torch.tensor([token_ids]), max_new_tokens=MAX_NEW,
                                     do_sample=False, attention_mask=torch.ones(1, len(key),
                                                                                dtype=torch.long))
            cache[key] = out[0, len(key):].tolist()
        return cache[key]

    return generate


def engine_for(path, **kw):
    cfg = dict(model=str(path), block_size=BLOCK_SIZE, num_blocks=64, max_model_len=256)
    cfg.update(kw)
    return build_engine(EngineConfig(**cfg))


async def run_all(engine, prompts, stagger=False):
    async def one(i, p):
        out = [d async for d in engine.generate(EngineRequest(
            f"r{i}", p, SamplingParams(max_tokens=MAX_NEW, temperature=0)))]
        return [t for d in out for t in d.token_ids], out[-1].usage

    if not stagger:
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return [await one(i, p) for i, p in enumerate(prompts)]


SYSTEM = prompt(21, seed=100)
PROMPTS = [SYSTEM + prompt(n, seed=n) for n in (3, 9, 14)] + [prompt(5, 1), prompt(30, 2)]


async def test_mixed_batch_and_cache_hits_match_hf(checkpoint, hf):
    engine = engine_for(checkpoint)
    cold = await run_all(engine, PROMPTS)
    assert [t for t, _ in cold] == [hf(p) for p in PROMPTS]
    # The shared system prompt was computed once and hit by the other two (same batch).
    assert sum(u.cached_tokens_device for _, u in cold) >= 2 * 20
    warm = await run_all(engine, PROMPTS, stagger=True)
    assert [t for t, _ in warm] == [hf(p) for p in PROMPTS]
    assert all(u.cached_tokens > 0 for _, u in warm)
    await engine.shutdown()


async def test_chunked_prefill_across_block_boundaries_matches_hf(checkpoint, hf):
    engine = engine_for(checkpoint, max_num_batched_tokens=7)
    out = await run_all(engine, PROMPTS)
    assert [t for t, _ in out] == [hf(p) for p in PROMPTS]
    await engine.shutdown()


async def test_preemption_by_recompute_matches_hf(checkpoint, hf):
    engine = engine_for(checkpoint, num_blocks=14)  # 56 token slots for ~100 tokens of work
    out = await run_all(engine, PROMPTS)
    assert engine.core.scheduler.num_preemptions > 0
    assert [t for t, _ in out] == [hf(p) for p in PROMPTS]
    await engine.shutdown()


async def test_host_tier_hits_are_copied_back_and_match_hf(checkpoint, hf):
    engine = engine_for(checkpoint, num_blocks=12, num_host_blocks=32)
    first = await run_all(engine, PROMPTS[:1])
    await run_all(engine, [prompt(40, seed=9)])  # evicts the first prompt to the host tier
    again = await run_all(engine, PROMPTS[:1])
    assert again[0][1].cached_tokens_host > 0
    assert again[0][0] == first[0][0] == hf(PROMPTS[0])
    await engine.shutdown()



async def test_logprobs_are_the_models_log_softmax(checkpoint):
    """The sampler's logprobs against transformers' own scores of the same greedy steps."""
    model = load_hf(checkpoint)
    engine = engine_for(checkpoint)
    p = PROMPTS[0]
    deltas = [d async for d in engine.generate(EngineRequest(
        "lp", p, SamplingParams(max_tokens=4, temperature=0, logprobs=3)))]
    entries = [e for d in deltas for e in d.logprobs]
    with torch.no_grad():
        out = model.generate(torch.tensor([p]), max_new_tokens=4, do_sample=False,
                             attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             output_scores=True, return_dict_in_generate=True)
    for entry, scores in zip(entries, out.scores, strict=True):
        expected = torch.log_softmax(scores[0].float(), dim=-1)
        top = torch.topk(expected, 3)
        assert entry.token_id == int(expected.argmax())
        assert entry.logprob == pytest.approx(float(expected[entry.token_id]), abs=1e-4)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        assert [v for _, v in entry.top] == pytest.approx(top.values.tolist(), abs=1e-4)
    await engine.shutdown()
