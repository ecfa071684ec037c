"""Helpers for the model tests: tiny HF configs, the HF oracle, and hand-built steps."""

from __future__ import annotations

from pathlib import Path

import torch

from kv.manager import CopyPlan
from worker.engine.step import ScheduledSeq, StepInput
from worker.executor.config import ModelExecutorConfig
from worker.executor.model_runner import ModelRunner
from worker.tp.communicator import SingleProcessCommunicator

BLOCK_SIZE = 4  # small, so short prompts cross several block boundaries

_COMMON = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    bos_token_id=None,
    eos_token_id=None,  # HF generate then runs exactly max_new_tokens
)
CONFIGS = {
    "llama": dict(_COMMON, model_type="llama"),
    "llama3": dict(
        _COMMON,
        model_type="llama",
        rope_theta=500000.0,
        # wavelengths 6.3, 32.5, 167, ...: with original length 64 the bands (< 16,
        # 16..64, > 64) all hold some
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    # q/k/v biases and tied embeddings
    "qwen2": dict(_COMMON, model_type="qwen2", tie_word_embeddings=True),
    "mistral": dict(_COMMON, model_type="mistral", sliding_window=None),
}


def prompt(length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 300, (length,), generator=gen).tolist()


def load_hf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab] fp32 logits of every position."""
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].float()


def make_runner(
    path: Path,
    num_blocks: int = 48,
    num_host_blocks: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
) -> ModelRunner:
    config = ModelExecutorConfig(
        model_dir=path,
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        num_host_blocks=num_host_blocks,
        dtype=dtype,
        device=device,
    )
    return ModelRunner(config, SingleProcessCommunicator(), device)


def seq(
    request_id: str,
    token_ids: list[int],
    start_pos: int,
    block_ids: list[int],
    sample: bool = True,
    skip_kv_write: int = 0,
) -> ScheduledSeq:
    return ScheduledSeq(request_id, token_ids, start_pos, block_ids, sample, skip_kv_write)


def step(*seqs: ScheduledSeq, swap_out=(), swap_in=()) -> StepInput:
    return StepInput(list(seqs), CopyPlan(list(swap_out), list(swap_in)))
