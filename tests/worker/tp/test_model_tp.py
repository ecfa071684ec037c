"""TP 2 (two processes over gloo) computes what TP 1 computes."""

from __future__ import annotations

import torch

from tests.worker.model.model_harness import CONFIGS, hf_logits, load_hf, prompt, seq, step
from worker.executor.config import ModelExecutorConfig
from worker.executor.model_executor import ModelExecutor
from worker.model.random_checkpoint import write_random_checkpoint


def _run(executor: ModelExecutor, prompts: dict[str, list[int]], num_new: int):
    """Prefill all prompts in one batch, then greedy-decode them together."""
    blocks = {"a": [3, 4, 5, 6, 7], "b": [3, 4, 8, 9, 10, 11]}  # "b" shares a's first blocks
    first = executor.execute(step(seq("a", prompts["a"], 0, blocks["a"])))
    # "b" starts after the 8 tokens it shares with "a"; the rest of it is one chunk
    second = executor.execute(step(seq("b", prompts["b"][8:], 8, blocks["b"])))
    logits = {"a": [first[0]], "b": [second[0]]}
    out = {r: [int(rows[0].argmax())] for r, rows in logits.items()}
    for _ in range(num_new - 1):
        batch = executor.execute(
            step(
                *(
                    seq(r, [out[r][-1]], len(prompts[r]) + len(out[r]) - 1, blocks[r])
                    for r in ("a", "b")
                )
            )
        )
        for row, r in enumerate(("a", "b")):
            logits[r].append(batch[row])
            out[r].append(int(batch[row].argmax()))
    return out, {r: torch.stack(rows) for r, rows in logits.items()}


def test_tp2_matches_tp1_and_transformers(tmp_path):
    # vocab 301 pads the second vocab shard; biases everywhere; tied embeddings
    config = dict(
        CONFIGS["llama"],
        vocab_size=301,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
    )
    path = write_random_checkpoint(tmp_path / "m", config, seed=3)
    shared = prompt(8, seed=1)
    prompts = {"a": shared + prompt(5, seed=2), "b": shared + prompt(7, seed=3)}
    num_new = 6

    def run(tp):
        cfg = ModelExecutorConfig(
            model_dir=path, tp=tp, num_blocks=16, block_size=4, dist_timeout_s=60
        )
        with ModelExecutor(cfg) as executor:
            return _run(executor, prompts, num_new)

    tokens_1, logits_1 = run(1)
    tokens_2, logits_2 = run(2)
    assert tokens_2 == tokens_1
    hf = load_hf(path)
    for r in ("a", "b"):
        torch.testing.assert_close(logits_2[r], logits_1[r], atol=1e-4, rtol=0)
        # HF's logits at the last prompt position and at each generated token but the last
        expected = hf_logits(hf, prompts[r] + tokens_1[r])[len(prompts[r]) - 1 : -1]
        torch.testing.assert_close(logits_2[r], expected, atol=1e-4, rtol=0)
