"""Seeded random weights for generated checkpoints (`tiny`, tests, benchmarks).

Scales keep activations O(1) through the layers so the logits are not near-uniform (greedy
decoding of a random model then has clear winners and is stable across kernels).
"""

from __future__ import annotations

import torch


def random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A fp32 tensor for HF parameter `name`, drawn from gen."""
    noise = torch.randn(shape, generator=gen, dtype=torch.float32)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * noise
    if name.endswith(".bias"):
        return 0.1 * noise
    if "embed_tokens" in name:
        return noise
    return noise / shape[-1] ** 0.5


def llama_weight_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for a Llama config dict without biases or tied embeddings."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_size = config["num_attention_heads"] * head_dim
    kv_size = config["num_key_value_heads"] * head_dim
    shapes = {
        "model.embed_tokens.weight": (config["vocab_size"], hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (config["vocab_size"], hidden),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes[p + "self_attn.q_proj.weight"] = (q_size, hidden)
        shapes[p + "self_attn.k_proj.weight"] = (kv_size, hidden)
        shapes[p + "self_attn.v_proj.weight"] = (kv_size, hidden)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, q_size)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
    return shapes
