"""Attention over the paged KV cache: fused QKV projection, per-head q/k RMSNorm (Qwen3),
RoPE, KV write, attention, row-parallel output projection. Each rank owns num_heads / tp
query heads and num_kv_heads / tp KV heads (and their cache); the q/k norm weights span one
head and are the same for every head, so each rank holds them whole."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import kernels
from worker.model.config import ModelConfig
from worker.model.layers import ColumnParallelLinear, RMSNorm, RowParallelLinear
from worker.model.rope import apply_rope
from worker.tp.communicator import Communicator


@dataclass(frozen=True)
class AttentionMetadata:
    """Where each token of a packed batch reads and writes KV. N requests, T tokens.

    slot_mapping: [T] int64 cache slot per token, -1 = do not write (KV already cached).
    block_tables: [N, max_blocks] int32 block ids per request, 0-padded.
    seq_lens: [N] int32 tokens per request after this step (cached + new).
    cu_seqlens_q: [N + 1] int32 prefix sums of new tokens per request.
    max_query_len: the longest request's new tokens (host int, sizes kernel grids).
    decode_plan: on CPU, how the requests with one new token share KV blocks (the cascade
        decode reads a shared prefix once per group); built once per step, used by every
        layer. None: plain decode (CUDA, or fewer than two such requests).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    max_query_len: int
    decode_plan: kernels.CascadePlan | None = None

    @property
    def decode_only(self) -> bool:
        """Every request computes one token: the decode kernel serves the whole batch."""
        return self.max_query_len == 1


@dataclass(frozen=True)
class LayerKVCache:
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads / tp, head_dim]
    v_cache: torch.Tensor


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, comm: Communicator, dtype: torch.dtype, device) -> None:
        super().__init__()
        tp = comm.world_size
        self.num_heads = config.num_heads // tp
        self.num_kv_heads = config.num_kv_heads // tp
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size, q_size + 2 * kv_size, config.qkv_bias, dtype=dtype, device=device
        )
        self.o_proj = RowParallelLinear(
            q_size, config.hidden_size, config.o_proj_bias, comm, dtype=dtype, device=device
        )
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            eps = config.rms_norm_eps
            self.q_norm = RMSNorm(config.head_dim, eps, dtype=dtype, device=device)
            self.k_norm = RMSNorm(config.head_dim, eps, dtype=dtype, device=device)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,  # [T, 1, D]
        sin: torch.Tensor,
        cache: LayerKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens, num_heads = hidden.shape[0], self.num_heads
        qkv = self.qkv_proj(hidden).view(num_tokens, -1, self.head_dim)  # [T, Hq + 2 Hkv, D]
        # q and k side by side: one rotation for both (a decode step is many tiny ops).
        qk, v = qkv[:, : num_heads + self.num_kv_heads], qkv[:, num_heads + self.num_kv_heads :]
        if self.q_norm is not None and self.k_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :num_heads]), self.k_norm(qk[:, num_heads:])), 1)
        qk = apply_rope(qk, cos, sin)
        q, k = qk[:, :num_heads], qk[:, num_heads:]
        kernels.write_kv(k, v, cache.k_cache, cache.v_cache, meta.slot_mapping)
        if meta.decode_only:
            out = kernels.decode_attention(
                q, cache.k_cache, cache.v_cache, meta.block_tables, meta.seq_lens, self.scale,
                meta.decode_plan,
            )
        else:
            out = kernels.prefill_attention(
                q,
                cache.k_cache,
                cache.v_cache,
                meta.block_tables,
                meta.cu_seqlens_q,
                meta.seq_lens,
                self.scale,
                meta.max_query_len,
                meta.decode_plan,
            )
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))
