"""TP 2 through the whole engine (two processes, gloo) equals transformers' greedy output."""

import pytest

from tests.worker.engine.test_engine_hf import MAX_NEW, PROMPTS, engine_for, run_all
from tests.worker.model.model_harness import CONFIGS, load_hf
from worker.model.random_checkpoint import write_random_checkpoint


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-tp")
    write_random_checkpoint(path, CONFIGS["llama"], seed=3)
    return path


async def test_tp2_engine_matches_hf(llama):
    import torch

    model = load_hf(llama)
    expected = []
    for p in PROMPTS[:3]:
        with torch.no_grad():
            out = model.generate(torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False,
                                 attention_mask=torch.ones(1, len(p), dtype=torch.long))
        expected.append(out[0, len(p):].tolist())
    engine = engine_for(llama, tp=2)
    try:
        out = await run_all(engine, PROMPTS[:3])
        assert [t for t, _ in out] == expected
        assert out[1][1].cached_tokens > 0
    finally:
        await engine.shutdown()
