"""Qwen3 (dense) against transformers' Qwen3ForCausalLM on a tiny random checkpoint: per-head
q/k RMSNorm, no q/k/v bias, a head_dim (32) that is not hidden / heads (64 / 4), tied
embeddings. Logits, greedy tokens, prefix-cache hits, TP 1 and TP 2."""

from __future__ import annotations

import pytest
import torch

from tests.worker.engine.test_engine_hf import MAX_NEW, PROMPTS, engine_for, run_all
from tests.worker.model.model_harness import (
    CONFIGS,
    hf_logits,
    load_hf,
    make_runner,
    prompt,
    seq,
    step,
)
from tests.worker.tp.test_model_tp import _run as run_shared_prefix_decode
from worker.executor.config import ModelExecutorConfig
from worker.executor.model_executor import ModelExecutor
from worker.model.config import ModelConfig
from worker.model.random_checkpoint import write_random_checkpoint

ATOL = 1e-4
QWEN3 = dict(
    CONFIGS["llama"],
    model_type="qwen3",
    head_dim=32,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
    use_sliding_window=False,
    max_window_layers=2,
)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """(checkpoint dir, the HF model loaded from it)."""
    path = write_random_checkpoint(tmp_path_factory.mktemp("qwen3"), QWEN3, seed=5)
    return path, load_hf(path)


def hf_greedy(hf, token_ids: list[int], num_new: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([token_ids]),
            max_new_tokens=num_new,
            do_sample=False,
            attention_mask=torch.ones(1, len(token_ids), dtype=torch.long),
        )
    return out[0, len(token_ids) :].tolist()


def test_config_of_a_released_qwen3():
    """Qwen3-0.6B's config.json and generation_config.json as published."""
    hf = dict(
        architectures=["Qwen3ForCausalLM"],
        attention_bias=False,
        bos_token_id=151643,
        eos_token_id=151645,
        head_dim=128,
        hidden_act="silu",
        hidden_size=1024,
        intermediate_size=3072,
        max_position_embeddings=40960,
        max_window_layers=28,
        model_type="qwen3",
        num_attention_heads=16,
        num_hidden_layers=28,
        num_key_value_heads=8,
        rms_norm_eps=1e-6,
        rope_scaling=None,
        rope_theta=1000000,
        sliding_window=None,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
        use_sliding_window=False,
        vocab_size=151936,
    )
    config = ModelConfig.from_hf(hf, generation={"eos_token_id": [151645, 151643]})
    assert config.architecture == "Qwen3ForCausalLM"
    assert (config.head_dim, config.num_heads, config.num_kv_heads) == (128, 16, 8)
    assert (config.qk_norm, config.qkv_bias, config.o_proj_bias) == (True, False, False)
    assert (config.rope_theta, config.rope_scaling) == (1e6, None)
    assert config.tie_word_embeddings and config.checkpoint_dtype == torch.bfloat16
    assert config.eos_token_ids == (151645, 151643)
    assert config.max_model_len_tokens == 40960
    config.check_tp(2)
    # A window declared but switched off does not cap the context; switched on for the
    # layers from max_window_layers on, it does (sliding attention is not implemented).
    assert ModelConfig.from_hf(dict(hf, sliding_window=4096)).max_model_len_tokens == 40960
    windowed = dict(hf, sliding_window=4096, use_sliding_window=True, max_window_layers=20)
    assert ModelConfig.from_hf(windowed).max_model_len_tokens == 4096
    # Only Qwen3 has the q/k norm; a Qwen2 config keeps its q/k/v biases and no norm.
    qwen2 = ModelConfig.from_hf(dict(hf, architectures=["Qwen2ForCausalLM"]))
    assert (qwen2.qk_norm, qwen2.qkv_bias) == (False, True)
    by_type = dict(hf, architectures=None)
    assert ModelConfig.from_hf(by_type).architecture == "Qwen3ForCausalLM"


def test_prompt_logits_and_greedy_decode_match_hf(qwen3):
    path, hf = qwen3
    runner = make_runner(path)
    assert runner.model.layers[0].self_attn.q_norm is not None
    tokens, num_new = prompt(11, seed=1), 10
    blocks = [7, 3, 12, 0, 30, 21]  # 24 slots, scattered
    logits = [runner.execute(step(seq("a", tokens, 0, blocks)))[0]]
    out = [int(logits[0].argmax())]
    while len(out) < num_new:
        pos = len(tokens) + len(out) - 1
        logits.append(runner.execute(step(seq("a", [out[-1]], pos, blocks)))[0])
        out.append(int(logits[-1].argmax()))
    assert out == hf_greedy(hf, tokens, num_new)
    expected = hf_logits(hf, tokens + out)[len(tokens) - 1 : -1]
    torch.testing.assert_close(torch.stack(logits), expected, atol=ATOL, rtol=0)


def test_prefix_cache_hit_matches_hf(qwen3):
    path, hf = qwen3
    runner = make_runner(path)
    shared = prompt(8, seed=11)  # two full blocks of 4
    runner.execute(step(seq("a", shared + [1, 2, 3], 0, [10, 20, 30])))
    # "b" reuses a's two blocks and computes only its own tail
    logits = runner.execute(step(seq("b", [4, 5, 6, 7, 8], 8, [10, 20, 31, 32])))
    torch.testing.assert_close(logits[0], hf_logits(hf, shared + [4, 5, 6, 7, 8])[-1],
                               atol=ATOL, rtol=0)
    # "c" is exactly the shared prompt: it recomputes only its last token
    logits = runner.execute(step(seq("c", shared[-1:], 7, [10, 20], skip_kv_write=1)))
    torch.testing.assert_close(logits[0], hf_logits(hf, shared)[-1], atol=ATOL, rtol=0)


async def test_engine_greedy_with_cache_hits_matches_hf(qwen3):
    path, hf = qwen3
    engine = engine_for(path)
    try:
        cold = await run_all(engine, PROMPTS)
        expected = [hf_greedy(hf, p, MAX_NEW) for p in PROMPTS]
        assert [t for t, _ in cold] == expected
        warm = await run_all(engine, PROMPTS, stagger=True)
        assert [t for t, _ in warm] == expected
        assert all(u.cached_tokens > 0 for _, u in warm)
    finally:
        await engine.shutdown()


def test_tp2_matches_tp1_and_hf(tmp_path):
    # 2 KV heads over 2 ranks: one query group and its q/k norm per rank; vocab 301 pads the
    # second vocab shard
    path = write_random_checkpoint(tmp_path / "m", dict(QWEN3, vocab_size=301), seed=6)
    shared = prompt(8, seed=1)
    prompts = {"a": shared + prompt(5, seed=2), "b": shared + prompt(7, seed=3)}

    def run(tp: int):
        cfg = ModelExecutorConfig(
            model_dir=path, tp=tp, num_blocks=16, block_size=4, dist_timeout_s=60
        )
        with ModelExecutor(cfg) as executor:
            return run_shared_prefix_decode(executor, prompts, num_new=6)

    tokens_1, logits_1 = run(1)
    tokens_2, logits_2 = run(2)
    assert tokens_2 == tokens_1
    hf = load_hf(path)
    for r in ("a", "b"):
        assert tokens_1[r] == hf_greedy(hf, prompts[r], 6)
        torch.testing.assert_close(logits_2[r], logits_1[r], atol=ATOL, rtol=0)
        expected = hf_logits(hf, prompts[r] + tokens_1[r])[len(prompts[r]) - 1 : -1]
        torch.testing.assert_close(logits_2[r], expected, atol=ATOL, rtol=0)
