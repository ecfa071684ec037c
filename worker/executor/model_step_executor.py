"""The real executor: the model on every TP rank (ModelExecutor), the sampler on rank 0."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from protocol.engine import SampledToken, SampleFailure, SamplingParams
from worker.engine.config import EngineConfig
from worker.engine.step import StepInput
from worker.executor.config import ModelExecutorConfig
from worker.executor.model_executor import ModelExecutor
from worker.executor.sampling import Sampler, suppressed_token_ids


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but no CUDA GPU is available")
    return device


class ModelStepExecutor:
    """Executor (worker/executor/executor.py) over a real model; TP > 1 starts ranks 1..tp-1
    (config.tp_launcher)."""

    def __init__(self, model_dir: str | Path, config: EngineConfig):
        self._model = ModelExecutor(ModelExecutorConfig(
            model_dir=Path(model_dir), num_blocks=config.num_blocks, tp=config.tp,
            block_size=config.block_size, num_host_blocks=config.num_host_blocks,
            dtype=config.dtype, device=pick_device(config.device),
            tp_launcher=config.tp_launcher))
        self.vocab_size = self._model.vocab_size
        self.eos_token_ids = tuple(self._model.model_config.eos_token_ids)
        self.sampler = Sampler()

    def execute(self, step: StepInput, sampling: Mapping[str, SamplingParams]
                ) -> dict[str, SampledToken | SampleFailure]:
        logits = self._model.execute(step)
        seqs = [s for s in step.seqs if s.sample]
        if not seqs:
            return {}
        ids = [s.request_id for s in seqs]
        params = [sampling[i] for i in ids]
        suppressed = [suppressed_token_ids(sp, s.num_output_tokens, self.eos_token_ids)
                      for sp, s in zip(params, seqs)]
        return self.sampler.sample_step(logits.float().cpu(), ids, params, suppressed)

    def release(self, request_id: str) -> None:
        self.sampler.release(request_id)

    def shutdown(self) -> None:
        self._model.shutdown()
