"""Tensor-parallel building blocks: RMSNorm, column/row-parallel linears, vocab-parallel
embedding and LM head. Parameters are allocated empty; the loader fills each rank's shard.

Sharding (tp ranks, rank r):
    ColumnParallelLinear  weight [out / tp, in]   output stays sharded (no communication)
    RowParallelLinear     weight [out, in / tp]   partial outputs all-reduced, bias added once
    VocabParallel*        weight [vocab_per_rank, hidden], rows r*vocab_per_rank onwards;
                          the last shard is zero-padded when tp does not divide the vocab
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worker.tp.communicator import Communicator


def _empty(*shape: int, dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 like the HF Llama reference."""

    def __init__(self, hidden_size: int, eps: float, *, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _empty(hidden_size, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(input_dtype)


class ColumnParallelLinear(nn.Module):
    """y_local = x W_local^T + b_local; W's output rows are split over ranks."""

    def __init__(
        self, in_features: int, out_features_per_rank: int, bias: bool, *, dtype: torch.dtype,
        device,
    ) -> None:
        super().__init__()
        self.weight = _empty(out_features_per_rank, in_features, dtype=dtype, device=device)
        self.bias = _empty(out_features_per_rank, dtype=dtype, device=device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x_local W_local^T, then + b; W's input columns are split."""

    def __init__(
        self,
        in_features_per_rank: int,
        out_features: int,
        bias: bool,
        comm: Communicator,
        *,
        dtype: torch.dtype,
        device,
    ) -> None:
        super().__init__()
        self.comm = comm
        self.weight = _empty(out_features, in_features_per_rank, dtype=dtype, device=device)
        self.bias = _empty(out_features, dtype=dtype, device=device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.comm.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


def vocab_per_rank(vocab_size: int, tp: int) -> int:
    return -(-vocab_size // tp)


class VocabParallelEmbedding(nn.Module):
    """Each rank embeds the token ids in its vocab range; the all-reduce fills the rest."""

    def __init__(
        self, vocab_size: int, hidden_size: int, comm: Communicator, *, dtype: torch.dtype, device
    ) -> None:
        super().__init__()
        self.comm = comm
        self.num_rows = vocab_per_rank(vocab_size, comm.world_size)
        self.vocab_start = comm.rank * self.num_rows
        self.weight = _empty(self.num_rows, hidden_size, dtype=dtype, device=device)
        self.weight.data.zero_()  # padding rows past the vocab stay zero

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.comm.world_size == 1:
            return F.embedding(token_ids, self.weight)
        local_ids = token_ids - self.vocab_start
        inside = (local_ids >= 0) & (local_ids < self.num_rows)
        out = F.embedding(torch.where(inside, local_ids, 0), self.weight)
        out = out * inside[:, None].to(out.dtype)
        return self.comm.all_reduce(out)


class ParallelLMHead(nn.Module):
    """Logits over this rank's vocab rows, all-gathered to the full vocab in fp32."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        comm: Communicator,
        *,
        dtype: torch.dtype,
        device,
        tied_to: VocabParallelEmbedding | None = None,
    ) -> None:
        super().__init__()
        self.comm = comm
        self.vocab_size = vocab_size
        if tied_to is None:
            rows = vocab_per_rank(vocab_size, comm.world_size)
            self.weight = _empty(rows, hidden_size, dtype=dtype, device=device)
            self.weight.data.zero_()
        else:
            self.weight = tied_to.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight).float()  # [S, vocab_per_rank]
        return self.comm.all_gather(logits)[:, : self.vocab_size]
