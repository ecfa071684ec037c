"""One TP rank's model runner: its weight shard, its KV cache and host tier, one step at a
time. It does not know how its process was started (in-process, spawned, a Ray actor):
it is handed a communicator and a device."""

from __future__ import annotations

from pathlib import Path

import torch

from worker.forward_batch import build_forward_batch, check_step
from worker.kv_cache import PagedKVCache
from worker.loader import load_model
from worker.step import StepInput
from worker.tp import Communicator


class ModelRunner:
    """Args:
    model_dir: a HF checkpoint directory (see worker.loader).
    tp_rank, tp_size: this rank and the replica's TP size (must match comm).
    comm: collectives over the replica's ranks.
    num_blocks, block_size: the device KV pool, in blocks of block_size tokens.
    num_host_blocks: host-memory slots for swapped-out blocks (pinned on CUDA).
    dtype: weights, activations and KV cache.
    device: this rank's device.
    """

    def __init__(
        self,
        model_dir: str | Path,
        tp_rank: int,
        tp_size: int,
        comm: Communicator,
        num_blocks: int,
        block_size: int,
        num_host_blocks: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if (comm.rank, comm.world_size) != (tp_rank, tp_size):
            raise ValueError(
                f"communicator is rank {comm.rank} of {comm.world_size}, "
                f"runner was asked for rank {tp_rank} of {tp_size}"
            )
        self.tp_rank = tp_rank
        self.device = torch.device(device)
        self.model = load_model(model_dir, comm, dtype, self.device)
        self.config = self.model.config
        self.kv = PagedKVCache(
            self.config, tp_size, num_blocks, block_size, num_host_blocks, dtype, self.device
        )

    @torch.inference_mode()
    def execute(self, step: StepInput) -> torch.Tensor | None:
        """Apply the step's block copies (swap out, then swap in), then run its forward.

        Returns fp32 logits [number of seqs with sample=True, vocab] in seqs order on rank
        0, on this runner's device; None on other ranks.
        """
        check_step(step, self.kv.block_size, self.kv.num_blocks, self.kv.num_host_blocks)
        self.kv.swap_out(step.copies.swap_out)
        self.kv.swap_in(step.copies.swap_in)
        if not step.seqs:
            logits = torch.empty(0, self.config.vocab_size, device=self.device)
        else:
            batch = build_forward_batch(step.seqs, self.kv.block_size, self.device)
            logits = self.model(
                batch.token_ids, batch.positions, batch.meta, self.kv.layers, batch.sample_rows
            )
        return logits if self.tp_rank == 0 else None
