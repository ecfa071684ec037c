"""The Llama family (Llama 2/3, Mistral, Qwen2, Qwen3 dense) as transformers defines it,
tensor-parallel.

    token ids -> embed -> [ x + attn(norm(x)); x + mlp(norm(x)) ] * L -> rows to sample
              -> norm -> LM head -> fp32 logits over the full vocab

The final norm and LM head run only on the rows that are sampled (the last token of each
request that samples this step), not on every prefill token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worker.model.attention import Attention, AttentionMetadata, LayerKVCache
from worker.model.config import ModelConfig
from worker.model.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RMSNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from worker.model.rope import rope_cos_sin, rope_inv_freq
from worker.tp.communicator import Communicator


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up fused into one column-parallel GEMM."""

    def __init__(self, config: ModelConfig, comm: Communicator, dtype: torch.dtype, device):
        super().__init__()
        self.intermediate_per_rank = config.intermediate_size // comm.world_size
        self.gate_up_proj = ColumnParallelLinear(
            config.hidden_size, 2 * self.intermediate_per_rank, config.mlp_bias,
            dtype=dtype, device=device,
        )
        self.down_proj = RowParallelLinear(
            self.intermediate_per_rank, config.hidden_size, config.mlp_bias, comm,
            dtype=dtype, device=device,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_per_rank, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, comm: Communicator, dtype: torch.dtype, device):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype, device=device)
        self.self_attn = Attention(config, comm, dtype, device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype, device=device)
        self.mlp = MLP(config, comm, dtype, device)

    def forward(self, x, cos, sin, cache: LayerKVCache, meta: AttentionMetadata):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    """One TP rank's shard of the model. Parameters start empty: load them with
    worker.model.loader.load_weights."""

    def __init__(self, config: ModelConfig, comm: Communicator, dtype: torch.dtype, device) -> None:
        super().__init__()
        config.check_tp(comm.world_size)
        self.config = config
        self.comm = comm
        self.dtype = dtype
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, comm, dtype=dtype, device=device
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, comm, dtype, device) for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(
            config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device
        )
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            comm,
            dtype=dtype,
            device=device,
            tied_to=self.embed_tokens if config.tie_word_embeddings else None,
        )
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        meta: AttentionMetadata,
        kv_caches: list[LayerKVCache],
        sample_rows: torch.Tensor,  # [S] int64 rows of the batch whose logits are wanted
    ) -> torch.Tensor:
        """Returns fp32 logits [S, vocab_size] (every rank gets the full vocab)."""
        x = self.embed_tokens(token_ids)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, cos, sin, cache, meta)
        return self.lm_head(self.norm(x[sample_rows]))
