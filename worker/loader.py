"""Load a Hugging Face checkpoint directory; each TP rank reads only its own shard.

A checkpoint directory holds config.json, one or many *.safetensors (several are listed by
model.safetensors.index.json), tokenizer.json, and optionally tokenizer_config.json (with
the chat template), chat_template.jinja and generation_config.json.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from worker.model import LlamaForCausalLM
from worker.model_config import ModelConfig
from worker.tokenizer_files import load_tokenizer_files, read_json, require_dir
from worker.tp import Communicator
from worker.weights import expected_weight_names, weight_target

_INDEX = "model.safetensors.index.json"


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Parse config.json (+ generation_config.json); FileNotFoundError / ValueError."""
    model_dir = require_dir(Path(model_dir))
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json")
    generation_path = model_dir / "generation_config.json"
    generation = read_json(generation_path) if generation_path.is_file() else None
    return ModelConfig.from_hf(read_json(config_path), generation)


def find_weight_files(model_dir: str | Path) -> tuple[Path, ...]:
    """The safetensors files of the checkpoint, from the index when there is one."""
    model_dir = require_dir(Path(model_dir))
    index_path = model_dir / _INDEX
    if index_path.is_file():
        names = sorted(set(read_json(index_path)["weight_map"].values()))
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{model_dir}: {_INDEX} lists missing files: {missing}")
        return tuple(model_dir / n for n in names)
    files = tuple(sorted(model_dir.glob("*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors weight files")
    return files


def check_checkpoint(model_dir: str | Path, tp: int) -> ModelConfig:
    """Validate everything a replica needs before any rank starts; returns the config."""
    config = load_model_config(model_dir)
    config.check_tp(tp)
    find_weight_files(model_dir)
    load_tokenizer_files(model_dir)
    return config


def load_weights(model: LlamaForCausalLM, model_dir: str | Path) -> None:
    """Fill this rank's parameters, reading only its slices of each tensor."""
    loaded: set[str] = set()
    for path in find_weight_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                target = weight_target(model, name)
                if target is None:
                    continue
                if target.dim is None:
                    tensor = f.get_tensor(name)
                    dst = target.param.data
                else:
                    part = f.get_slice(name)
                    if target.dim == 0:
                        tensor = part[target.src_start : target.src_end]
                    else:
                        tensor = part[:, target.src_start : target.src_end]
                    size = target.src_end - target.src_start
                    dst = target.param.data.narrow(target.dim, target.dst_start, size)
                if tuple(tensor.shape) != tuple(dst.shape):
                    raise ValueError(
                        f"checkpoint tensor {name!r}: shard shape {tuple(tensor.shape)} "
                        f"does not match the model's {tuple(dst.shape)}"
                    )
                dst.copy_(tensor)
                loaded.add(name)
    missing = expected_weight_names(model) - loaded
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks tensors: {sorted(missing)[:8]}")


def load_model(
    model_dir: str | Path, comm: Communicator, dtype: torch.dtype, device: torch.device | str
) -> LlamaForCausalLM:
    """Build this rank's shard and load its weights."""
    config = load_model_config(model_dir)
    config.check_tp(comm.world_size)
    model = LlamaForCausalLM(config, comm, dtype, device)
    load_weights(model, model_dir)
    return model.eval()
