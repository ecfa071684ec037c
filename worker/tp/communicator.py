"""The tensor-parallel communicator: the only place layers reach other ranks.

Layers call these collectives explicitly (row-parallel outputs are all-reduced, vocab
shards of the logits all-gathered); nothing is hooked into modules.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist


class Communicator(Protocol):
    """Collectives over the ranks of one model replica.

    Every rank must call each collective in the same order with same-shaped tensors.
    """

    rank: int
    world_size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over ranks, in place; returns x."""
        ...

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each rank's x along the last dim, in rank order."""
        ...

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank src's picklable obj, returned on every rank (others pass anything)."""
        ...


class SingleProcessCommunicator:
    """TP 1: every collective is the identity."""

    rank = 0
    world_size = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return obj


class TPCommunicator:
    """torch.distributed collectives over `group`.

    Args:
        rank, world_size: this rank's index within the group, and the group size.
        group: the process group for tensors (NCCL on GPU, gloo on CPU).
        cpu_group: a gloo group for pickled objects, so broadcasting a step's metadata
            does not round-trip through the GPU; defaults to `group`.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        group: dist.ProcessGroup,
        cpu_group: dist.ProcessGroup | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.cpu_group = cpu_group or group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=-1)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, group=self.cpu_group, group_src=src)
        return box[0]
