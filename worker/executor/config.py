"""The model side of one engine replica, as one frozen spec: the executor, every TP rank's
runner and its KV cache are built from it (so each setting has one name everywhere)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kv.hashing import DEFAULT_BLOCK_SIZE
from worker.model.config import parse_dtype


@dataclass(frozen=True)
class ModelExecutorConfig:
    model_dir: Path  # a checkpoint directory (worker.model.tiny.resolve_model("tiny") for tiny)
    num_blocks: int  # device KV blocks per rank (see kv_cache.num_blocks_for_memory)
    tp: int = 1  # tensor parallel ranks
    block_size: int = DEFAULT_BLOCK_SIZE  # tokens per KV block
    num_host_blocks: int = 0  # host-memory KV slots per rank
    dtype: str = "float32"  # float32 | float16 | bfloat16
    device: str = "cpu"  # cpu | cuda (local: rank r on cuda:r; ray: a GPU per rank actor)
    dist_timeout_s: float = 300.0  # how long a collective may wait for a peer rank
    tp_launcher: str = "local"  # ranks 1..tp-1: local | ray (actors in this placement group)

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        for name in ("num_blocks", "tp", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {self.num_host_blocks}")
        parse_dtype(self.dtype)
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.tp_launcher not in ("local", "ray"):
            raise ValueError(f"tp_launcher must be 'local' or 'ray', got {self.tp_launcher!r}")
        # Ray gives each rank actor its own GPU; only local ranks share this process's view.
        local = self.tp_launcher == "local"
        if self.device == "cuda" and local and self.tp > torch.cuda.device_count():
            raise ValueError(
                f"tp {self.tp} needs {self.tp} GPUs, {torch.cuda.device_count()} visible"
            )
        if self.dist_timeout_s <= 0:
            raise ValueError(f"dist_timeout_s must be > 0, got {self.dist_timeout_s}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)
