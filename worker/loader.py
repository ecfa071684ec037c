"""Load a Hugging Face checkpoint directory; each TP rank reads only its own shard.

A checkpoint directory holds config.json, one or many *.safetensors (several are listed by
model.safetensors.index.json), tokenizer.json, and optionally tokenizer_config.json (with
the chat template), chat_template.jinja and generation_config.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from worker.model import LlamaForCausalLM
from worker.model_config import ModelConfig
from worker.tp import Communicator
from worker.weights import expected_weight_names, weight_target

_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer_path: Path  # tokenizer.json, for tokenizers.Tokenizer.from_file
    chat_template: str | None  # Jinja source, None when the checkpoint has none
    bos_token: str | None
    eos_token: str | None


def _read_json(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return json.load(f)


def _require_dir(model_dir: Path) -> Path:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} does not exist")
    return model_dir


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Parse config.json (+ generation_config.json); FileNotFoundError / ValueError."""
    model_dir = _require_dir(Path(model_dir))
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json")
    generation_path = model_dir / "generation_config.json"
    generation = _read_json(generation_path) if generation_path.is_file() else None
    return ModelConfig.from_hf(_read_json(config_path), generation)


def find_weight_files(model_dir: str | Path) -> tuple[Path, ...]:
    """The safetensors files of the checkpoint, from the index when there is one."""
    model_dir = _require_dir(Path(model_dir))
    index_path = model_dir / _INDEX
    if index_path.is_file():
        names = sorted(set(_read_json(index_path)["weight_map"].values()))
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{model_dir}: {_INDEX} lists missing files: {missing}")
        return tuple(model_dir / n for n in names)
    files = tuple(sorted(model_dir.glob("*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors weight files")
    return files


def load_tokenizer_files(model_dir: str | Path) -> TokenizerFiles:
    model_dir = _require_dir(Path(model_dir))
    tokenizer_path = model_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise FileNotFoundError(f"{model_dir} has no tokenizer.json")
    config_path = model_dir / "tokenizer_config.json"
    tok_config = _read_json(config_path) if config_path.is_file() else {}
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default")
    jinja_path = model_dir / "chat_template.jinja"
    if template is None and jinja_path.is_file():
        template = jinja_path.read_text()
    return TokenizerFiles(
        tokenizer_path=tokenizer_path,
        chat_template=template,
        bos_token=_token_text(tok_config.get("bos_token")),
        eos_token=_token_text(tok_config.get("eos_token")),
    )


def _token_text(token: str | dict | None) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def check_checkpoint(model_dir: str | Path, tp_size: int) -> ModelConfig:
    """Validate everything a replica needs before any rank starts; returns the config."""
    config = load_model_config(model_dir)
    config.check_tp_size(tp_size)
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
    config.check_tp_size(comm.world_size)
    model = LlamaForCausalLM(config, comm, dtype, device)
    load_weights(model, model_dir)
    return model.eval()
