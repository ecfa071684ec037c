"""The model side of an engine replica behind one interface, whatever the TP size.

    executor = ModelExecutor(ModelExecutorConfig(model_dir=..., tp=2, num_blocks=512))
    logits = executor.execute(step)   # fp32 [seqs with sample=True, vocab], on rank 0's device
    executor.shutdown()

TP 1 runs the runner in this process. TP > 1 starts ranks 1..tp-1, as local processes
(tp_launcher "local") or as Ray actors in this actor's placement group (tp_launcher "ray",
see worker.tp.ray_workers), and makes this process rank 0, which broadcasts each StepInput before
computing its shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from worker.engine.step import StepInput
from worker.executor.config import ModelExecutorConfig
from worker.executor.forward_batch import check_step
from worker.executor.model_runner import ModelRunner
from worker.model.config import ModelConfig
from worker.model.loader import check_checkpoint
from worker.ports import free_port
from worker.tp.communicator import SingleProcessCommunicator
from worker.tp.workers import RankSpec, TPWorkerGroup, build_runner

if TYPE_CHECKING:
    from worker.tp.ray_workers import RayTPWorkerGroup


class ModelExecutor:
    """Runs steps on all TP ranks of one replica; returns rank 0's logits."""

    def __init__(self, config: ModelExecutorConfig) -> None:
        # Validate the checkpoint here, before any process starts, for a clear error.
        self.model_config: ModelConfig = check_checkpoint(config.model_dir, config.tp)
        self.config = config
        self._workers: TPWorkerGroup | RayTPWorkerGroup | None = None
        spec = RankSpec(config, init_method=f"tcp://127.0.0.1:{free_port()}")
        if config.tp == 1:
            self.runner = ModelRunner(config, SingleProcessCommunicator(), spec.torch_device(0))
            return
        if config.tp_launcher == "ray":
            from worker.tp.ray_workers import RayTPWorkerGroup  # Ray only when asked for

            workers = RayTPWorkerGroup(spec)
        else:
            workers = TPWorkerGroup(spec)
        try:
            self.runner = build_runner(spec, workers.comm)
        except BaseException:
            workers.leave_after_failed_start()
            raise
        self._workers = workers

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def execute(self, step: StepInput) -> torch.Tensor:
        """Block copies, then the forward on every rank.

        Returns fp32 logits [number of seqs with sample=True, vocab] in seqs order.
        """
        cfg = self.config
        check_step(step, cfg.block_size, cfg.num_blocks, cfg.num_host_blocks)
        if self._workers is not None:
            self._workers.send(step)
        logits = self.runner.execute(step)
        assert logits is not None  # this process is rank 0
        return logits

    def shutdown(self) -> None:
        """Stop the other ranks and leave the process group. Idempotent."""
        if self._workers is not None:
            self._workers.stop()
            self._workers = None

    def __enter__(self) -> ModelExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
