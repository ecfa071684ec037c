"""smollm2 through the whole engine (scheduler, paged KV, prefix cache, host tier, TP)
greedily equals transformers reading the same GGUF file in fp32."""

import asyncio

import pytest

from protocol.engine import EngineRequest, SamplingParams
from tests.worker.model.gguf.smollm2_oracle import (
    CHATS,
    chat_ids,
    hf_greedy,
    load_hf_model,
    long_document,
)
from worker.engine.config import EngineConfig
from worker.engine.factory import build_engine

pytestmark = pytest.mark.slow  # a 135M-parameter model, loaded by transformers and the engine

MAX_NEW = 12
PROMPTS = [chat_ids(messages) for messages in CHATS]
LONG = PROMPTS[-1]  # 1,180 tokens
# The long system prompt again with another question: a prefix-cache hit on ~1,150 tokens.
FOLLOW_UP = chat_ids([CHATS[-1][0], {"role": "user", "content": "Which town traded honey?"}])


@pytest.fixture(scope="module")
def hf():
    model = load_hf_model()
    cache: dict[tuple[int, ...], list[int]] = {}

    def greedy(token_ids: list[int]) -> list[int]:
        key = tuple(token_ids)
        if key not in cache:
            cache[key] = hf_greedy(model, token_ids, MAX_NEW)
        return cache[key]

    return greedy


async def run(engine, prompts, tag):
    async def one(i, p):
        out = [d async for d in engine.generate(EngineRequest(
            f"{tag}-{i}", p, SamplingParams(max_tokens=MAX_NEW, temperature=0)))]
        return [t for d in out for t in d.token_ids], out[-1].usage

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def engine(**kw):
    return build_engine(EngineConfig(**{"model": "smollm2", "num_blocks": 512, **kw}))


def test_the_prompts_include_one_of_over_a_thousand_tokens():
    assert len(LONG) > 1000


async def test_mixed_batch_then_prefix_hit_match_hf(hf):
    eng = engine()
    try:
        batch = await run(eng, PROMPTS, "batch")  # one batch, 27 to 1,180 tokens
        assert [t for t, _ in batch] == [hf(p) for p in PROMPTS]
        assert batch[0][0][-1] == 2  # stopped at eos, <|im_end|>, before MAX_NEW
        (hit,) = await run(eng, [FOLLOW_UP], "hit")
        assert hit[1].cached_tokens_device >= 1100
        assert hit[0] == hf(FOLLOW_UP)
    finally:
        await eng.shutdown()


async def test_host_tier_hit_matches_hf(hf):
    # 80 device blocks hold one long prompt; the second evicts the first to the host tier.
    eng = engine(num_blocks=80, num_host_blocks=256)
    try:
        (first,) = await run(eng, [LONG], "first")
        other = chat_ids([{"role": "system", "content": long_document(27)},
                          {"role": "user", "content": "Any salt?"}])
        await run(eng, [other], "evict")
        (again,) = await run(eng, [FOLLOW_UP], "again")
        assert again[1].cached_tokens_host >= 1000
        assert first[0] == hf(LONG)
        assert again[0] == hf(FOLLOW_UP)
    finally:
        await eng.shutdown()


async def test_tensor_parallel_matches_hf(hf):
    # 9 heads and 3 KV heads: TP 3 is the smallest split of this model (TP 2 is refused).
    with pytest.raises(ValueError, match="does not divide num_attention_heads"):
        engine(tp=2)
    eng = engine(tp=3)
    try:
        out = await run(eng, [PROMPTS[0], LONG], "tp")
        assert [t for t, _ in out] == [hf(PROMPTS[0]), hf(LONG)]
    finally:
        await eng.shutdown()
