"""Random-weight HF checkpoints of any supported config, for tests and benchmarks.

Built with transformers (a dev dependency, imported here only), so the files are exactly
what `save_pretrained` writes for that architecture: names, tied embeddings, sharding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from worker.model.random_weights import random_tensor
from worker.tokenizer.byte_tokenizer import BYTE_VOCAB_SIZE, write_byte_tokenizer


def write_random_checkpoint(
    path: str | Path,
    config: dict[str, Any],
    seed: int,
    max_shard_size: str | None = None,
) -> Path:
    """Write a seeded random checkpoint of the HF config dict (must name `model_type`)
    plus the byte-level tokenizer (so vocab_size >= 262) into path.

    max_shard_size (e.g. "200KB") splits the weights over several files with an index.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if config.get("vocab_size", 0) < BYTE_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be >= {BYTE_VOCAB_SIZE} for the byte tokenizer")
    fields = dict(config)
    hf_config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)  # transformers' own init, overwritten below
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            param.copy_(random_tensor(name, tuple(param.shape), gen))
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    write_byte_tokenizer(path, hf_config.max_position_embeddings)
    return path
