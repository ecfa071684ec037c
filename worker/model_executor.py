"""The model side of an engine replica behind one interface, whatever the TP size.

    executor = ModelExecutor(ModelExecutorConfig(model_dir=..., tp_size=2, num_blocks=512))
    logits = executor.execute(step)   # fp32 [seqs with sample=True, vocab], on rank 0's device
    executor.shutdown()

TP 1 runs the runner in this process. TP > 1 starts ranks 1..tp-1, as local processes
(launcher "local") or as Ray actors in this actor's placement group (launcher "ray", see
worker.ray_tp), and makes this process rank 0, which broadcasts each StepInput before
computing its shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from worker.forward_batch import check_step
from worker.loader import check_checkpoint
from worker.model_config import ModelConfig, parse_dtype
from worker.model_runner import ModelRunner
from worker.step import StepInput
from worker.tp import SingleProcessCommunicator
from worker.tp_workers import RankSpec, TPWorkerGroup, build_runner, free_port

if TYPE_CHECKING:
    from worker.ray_tp import RayTPWorkerGroup


@dataclass(frozen=True)
class ModelExecutorConfig:
    model_dir: Path  # a checkpoint directory (worker.tiny.resolve_model("tiny") for tiny)
    num_blocks: int  # device KV blocks per rank (see worker.kv_cache.num_blocks_for_memory)
    tp_size: int = 1
    block_size: int = 16  # tokens per KV block
    num_host_blocks: int = 0  # host-memory KV slots per rank
    dtype: str = "float32"  # float32 | float16 | bfloat16
    device: str = "cpu"  # cpu | cuda (local: rank r on cuda:r; ray: a GPU per rank actor)
    dist_timeout_s: float = 300.0  # how long a collective may wait for a peer rank
    launcher: str = "local"  # ranks 1..tp-1: local | ray (actors in this placement group)

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        for name in ("num_blocks", "tp_size", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {self.num_host_blocks}")
        parse_dtype(self.dtype)
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.launcher not in ("local", "ray"):
            raise ValueError(f"launcher must be 'local' or 'ray', got {self.launcher!r}")
        # Ray gives each rank actor its own GPU; only local ranks share this process's view.
        local = self.launcher == "local"
        if self.device == "cuda" and local and self.tp_size > torch.cuda.device_count():
            raise ValueError(
                f"tp_size {self.tp_size} needs {self.tp_size} GPUs, "
                f"{torch.cuda.device_count()} visible"
            )
        if self.dist_timeout_s <= 0:
            raise ValueError(f"dist_timeout_s must be > 0, got {self.dist_timeout_s}")


class ModelExecutor:
    """Runs steps on all TP ranks of one replica; returns rank 0's logits."""

    def __init__(self, config: ModelExecutorConfig) -> None:
        # Validate the checkpoint here, before any process starts, for a clear error.
        self.model_config: ModelConfig = check_checkpoint(config.model_dir, config.tp_size)
        self.config = config
        self._workers: TPWorkerGroup | RayTPWorkerGroup | None = None
        spec = RankSpec(
            model_dir=config.model_dir,
            tp_size=config.tp_size,
            num_blocks=config.num_blocks,
            block_size=config.block_size,
            num_host_blocks=config.num_host_blocks,
            dtype=config.dtype,
            device_type=config.device,
            init_method=f"tcp://127.0.0.1:{free_port()}",
            timeout_s=config.dist_timeout_s,
        )
        if config.tp_size == 1:
            self.runner = ModelRunner(
                config.model_dir,
                0,
                1,
                SingleProcessCommunicator(),
                config.num_blocks,
                config.block_size,
                config.num_host_blocks,
                parse_dtype(config.dtype),
                spec.device(0),
            )
            return
        if config.launcher == "ray":
            from worker.ray_tp import RayTPWorkerGroup  # Ray only when asked for

            workers = RayTPWorkerGroup(spec)
        else:
            workers = TPWorkerGroup(spec)
        try:
            self.runner = build_runner(spec, 0, workers.comm)
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
