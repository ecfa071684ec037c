"""The real executor: the model runner(s) for the forward pass, the sampler on rank 0."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from worker.api import SamplingParams
from worker.engine_config import EngineConfig
from worker.loader import load_model_config
from worker.model_runner import ModelRunner
from worker.sampling import Sampler
from worker.step import StepInput
from worker.tp import SingleProcessCommunicator

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but no CUDA GPU is available")
    return torch.device(device)


class ModelStepExecutor:
    """Executor (worker/executor.py) over a real model. TP 1 runs in this process; TP > 1
    runs one process per rank (worker.tp_workers) with rank 0's runner here."""

    def __init__(self, model_dir: str | Path, config: EngineConfig):
        model_config = load_model_config(model_dir)
        self.vocab_size = model_config.vocab_size
        self.eos_token_ids = tuple(model_config.eos_token_ids)
        self.sampler = Sampler()
        device = pick_device(config.device)
        dtype = DTYPES[config.dtype]
        if config.tp == 1:
            self._runner = ModelRunner(model_dir, 0, 1, SingleProcessCommunicator(),
                                       config.num_blocks, config.block_size,
                                       config.num_host_blocks, dtype, device)
            self._execute_logits = self._runner.execute
            self._shutdown = lambda: None
        else:
            from worker.tp_workers import TPExecutor

            tp = TPExecutor(model_dir, config.tp, config.num_blocks, config.block_size,
                            config.num_host_blocks, dtype, device)
            self._execute_logits = tp.execute
            self._shutdown = tp.shutdown

    def execute(self, step: StepInput, sampling: Mapping[str, SamplingParams]
                ) -> dict[str, int]:
        logits = self._execute_logits(step)
        ids = [s.request_id for s in step.seqs if s.sample]
        if not ids:
            return {}
        tokens = self.sampler.sample(logits.float().cpu(), ids, [sampling[i] for i in ids])
        return dict(zip(ids, tokens))

    def release(self, request_id: str) -> None:
        self.sampler.release(request_id)

    def shutdown(self) -> None:
        self._shutdown()
