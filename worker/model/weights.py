"""Where each HF checkpoint tensor goes in one TP rank's shard of LlamaForCausalLM.

HF tensor                          this rank's parameter       slice of the HF tensor
embed_tokens / lm_head [V, h]   -> [V/tp (padded), h]          rows of rank r
q/k/v_proj.weight|bias          -> qkv_proj rows [q | k | v]   rows of rank r's heads
gate/up_proj.weight|bias        -> gate_up_proj rows [g | u]   rows of rank r
o_proj / down_proj .weight      -> [h, in/tp]                  columns of rank r
norms, o_proj/down_proj .bias   -> same                        whole tensor

q_norm / k_norm (Qwen3) are [head_dim], one weight for every head: whole on every rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from worker.model.causal_lm import LlamaForCausalLM

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
_GATE_UP = ("mlp.gate_proj", "mlp.up_proj")
_QK_NORM = ("self_attn.q_norm", "self_attn.k_norm")
# Tensors some checkpoints carry that the model recomputes.
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")


@dataclass(frozen=True)
class WeightTarget:
    """Copy hf_tensor[src_start:src_end] along `dim` (dim None: the whole tensor) into
    param rows dst_start onwards (along the same dim)."""

    param: torch.Tensor
    dim: int | None
    src_start: int
    src_end: int
    dst_start: int


def expected_weight_names(model: LlamaForCausalLM) -> set[str]:
    """Every HF tensor name the checkpoint must provide for this model."""
    cfg = model.config
    per_layer = [f"{p}.weight" for p in (*_QKV, "self_attn.o_proj", *_GATE_UP, "mlp.down_proj")]
    per_layer += ["input_layernorm.weight", "post_attention_layernorm.weight"]
    if cfg.qkv_bias:
        per_layer += [f"{p}.bias" for p in _QKV]
    if cfg.o_proj_bias:
        per_layer.append("self_attn.o_proj.bias")
    if cfg.mlp_bias:
        per_layer += [f"{p}.bias" for p in (*_GATE_UP, "mlp.down_proj")]
    if cfg.qk_norm:
        per_layer += [f"{p}.weight" for p in _QK_NORM]
    names = {f"model.layers.{i}.{n}" for i in range(cfg.num_layers) for n in per_layer}
    names |= {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg.tie_word_embeddings:
        names.add("lm_head.weight")
    return names


def weight_target(model: LlamaForCausalLM, name: str) -> WeightTarget | None:
    """The destination of HF tensor `name` on this rank; None for tensors to skip.

    Raises ValueError for a name this architecture does not have.
    """
    if _IGNORED.search(name):
        return None
    target = _find_target(model, name)
    if target is None or target.param is None:  # e.g. a bias the config does not declare
        raise ValueError(f"checkpoint tensor {name!r} does not belong to this model")
    return target


def _find_target(model: LlamaForCausalLM, name: str) -> WeightTarget | None:
    rank = model.comm.rank
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        module = model.embed_tokens if name.startswith("model.") else model.lm_head
        rows = model.embed_tokens.num_rows
        start = rank * rows
        end = min(start + rows, model.config.vocab_size)
        return WeightTarget(module.weight, 0, start, end, 0)
    if name == "model.norm.weight":
        return WeightTarget(model.norm.weight, None, 0, 0, 0)
    match = _LAYER.match(name)
    if match is None or int(match.group(1)) >= len(model.layers):
        return None
    layer = model.layers[int(match.group(1))]
    prefix, _, kind = match.group(2).rpartition(".")
    attn, mlp = layer.self_attn, layer.mlp
    if prefix in _QKV and kind in ("weight", "bias"):
        q_size, kv_size, _ = attn.split_sizes
        size = q_size if prefix == _QKV[0] else kv_size
        dst = {_QKV[0]: 0, _QKV[1]: q_size, _QKV[2]: q_size + kv_size}[prefix]
        return WeightTarget(getattr(attn.qkv_proj, kind), 0, rank * size, (rank + 1) * size, dst)
    if prefix in _GATE_UP and kind in ("weight", "bias"):
        size = mlp.intermediate_per_rank
        dst = 0 if prefix == _GATE_UP[0] else size
        return WeightTarget(getattr(mlp.gate_up_proj, kind), 0, rank * size, (rank + 1) * size, dst)
    row_parallel = {"self_attn.o_proj": attn.o_proj, "mlp.down_proj": mlp.down_proj}
    if prefix in row_parallel and kind == "weight":
        param = row_parallel[prefix].weight
        size = param.shape[1]
        return WeightTarget(param, 1, rank * size, (rank + 1) * size, 0)
    if prefix in row_parallel and kind == "bias":
        return WeightTarget(row_parallel[prefix].bias, None, 0, 0, 0)
    if prefix in ("input_layernorm", "post_attention_layernorm") and kind == "weight":
        return WeightTarget(getattr(layer, prefix).weight, None, 0, 0, 0)
    if prefix in _QK_NORM and kind == "weight":
        norm = attn.q_norm if prefix == _QK_NORM[0] else attn.k_norm
        return None if norm is None else WeightTarget(norm.weight, None, 0, 0, 0)
    return None
