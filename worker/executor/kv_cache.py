"""One rank's paged KV cache on the device and its host-memory tier.

Both are single tensors over all layers, so a block copy moves every layer's K and V with
one gather and one transfer:

    device: [num_layers, 2 (K, V), num_blocks,      block_size, num_kv_heads / tp, head_dim]
    host:   [num_layers, 2 (K, V), num_host_blocks, block_size, num_kv_heads / tp, head_dim]
"""

from __future__ import annotations

import torch

from worker.executor.config import ModelExecutorConfig
from worker.model.attention import LayerKVCache
from worker.model.config import ModelConfig


def kv_block_bytes(config: ModelConfig, block_size: int, tp: int, dtype: torch.dtype) -> int:
    """Bytes one KV block takes on one rank (all layers, K and V)."""
    per_token = 2 * config.num_layers * (config.num_kv_heads // tp) * config.head_dim
    return per_token * block_size * torch.empty(0, dtype=dtype).element_size()


def num_blocks_for_memory(
    config: ModelConfig, block_size: int, tp: int, dtype: torch.dtype, memory_bytes: int
) -> int:
    """How many KV blocks fit in memory_bytes on each rank."""
    return memory_bytes // kv_block_bytes(config, block_size, tp, dtype)


class PagedKVCache:
    """Device KV blocks plus host slots, and block copies between them (ids are checked by
    the caller: worker.executor.forward_batch.check_step)."""

    def __init__(
        self, model_config: ModelConfig, config: ModelExecutorConfig, device: torch.device
    ) -> None:
        self.num_blocks = config.num_blocks
        self.block_size = config.block_size
        self.num_host_blocks = config.num_host_blocks
        dtype = config.torch_dtype
        per_block = (config.block_size, model_config.num_kv_heads // config.tp,
                     model_config.head_dim)
        self.device_kv = torch.zeros(
            model_config.num_layers, 2, config.num_blocks, *per_block, dtype=dtype, device=device
        )
        self.host_kv = torch.zeros(
            model_config.num_layers,
            2,
            config.num_host_blocks,
            *per_block,
            dtype=dtype,
            pin_memory=device.type == "cuda",
        )
        self.layers = [LayerKVCache(layer[0], layer[1]) for layer in self.device_kv]

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks to host slots: pairs of (device_block_id, host_slot)."""
        if not pairs:
            return
        block_ids, host_slots = torch.tensor(pairs, dtype=torch.int64).T
        blocks = self.device_kv[:, :, block_ids.to(self.device_kv.device)]
        self.host_kv[:, :, host_slots] = blocks.cpu()

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy host slots to device blocks: pairs of (host_slot, device_block_id)."""
        if not pairs:
            return
        host_slots, block_ids = torch.tensor(pairs, dtype=torch.int64).T
        shape = list(self.host_kv.shape)
        shape[2] = len(pairs)
        # Gather into pinned memory so the host-to-device copy is asynchronous.
        blocks = torch.empty(shape, dtype=self.host_kv.dtype, pin_memory=self.device_kv.is_cuda)
        torch.index_select(self.host_kv, 2, host_slots, out=blocks)
        device = self.device_kv.device
        self.device_kv[:, :, block_ids.to(device)] = blocks.to(device, non_blocking=True)
