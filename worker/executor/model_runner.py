"""One TP rank's model runner: its weight shard, its KV cache and host tier, one step at a
time. It does not know how its process was started (in-process, spawned, a Ray actor):
it is handed a communicator and a device."""

from __future__ import annotations

import torch

from worker.engine.step import StepInput
from worker.executor.config import ModelExecutorConfig
from worker.executor.forward_batch import build_forward_batch, check_step
from worker.executor.kv_cache import PagedKVCache
from worker.model.loader import load_model
from worker.tp.communicator import Communicator


class ModelRunner:
    """Args:
    config: the replica's model side; config.tp must be comm's world size.
    comm: collectives over the replica's ranks; this runner is rank comm.rank.
    device: this rank's device.
    """

    def __init__(
        self, config: ModelExecutorConfig, comm: Communicator, device: torch.device | str
    ) -> None:
        if comm.world_size != config.tp:
            raise ValueError(
                f"communicator has {comm.world_size} ranks, the config asks for tp {config.tp}"
            )
        self.tp_rank = comm.rank
        self.device = torch.device(device)
        self.model = load_model(config.model_dir, comm, config.torch_dtype, self.device)
        self.config = self.model.config
        self.kv = PagedKVCache(self.config, config, self.device)

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
