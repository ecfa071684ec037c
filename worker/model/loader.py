"""Load a Hugging Face checkpoint directory; each TP rank reads only its own shard.

A checkpoint directory holds config.json, one or many *.safetensors (several are listed by
model.safetensors.index.json), tokenizer.json, and optionally tokenizer_config.json (with
the chat template), chat_template.jinja and generation_config.json.

The safetensors files are mapped, not read. A CPU parameter that is a whole tensor of the
file, in the model's dtype, on a 64-byte boundary in the file (a GGUF conversion's are:
worker/model/gguf/aligned_safetensors.py) is that part of the mapping: no copy, and the replicas
of a host share its pages in the page cache. Any other tensor (or this rank's slice of it)
is copied once from the mapping into its parameter. (Not an unaligned one: BLAS kernels
round differently on it, and the logits would depend on where a tensor sits in its file.)
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from worker.model.causal_lm import LlamaForCausalLM
from worker.model.config import ModelConfig
from worker.model.gguf.aligned_safetensors import ALIGN_BYTES
from worker.model.layers import ColumnParallelLinear, ParallelLMHead, RowParallelLinear
from worker.model.weights import expected_weight_names, weight_target
from worker.tokenizer.files import load_tokenizer_files, read_json, require_dir
from worker.tp.communicator import Communicator

_INDEX = "model.safetensors.index.json"
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


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


def mapped_tensors(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for each tensor of a safetensors file, as views of the file mapped
    copy-on-write: a page is read when first touched, and writing to a view never changes
    the file. ValueError for a file that is not safetensors."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        header_len = struct.unpack("<Q", head)[0] if len(head) == 8 else size
        if header_len > size - 8:
            raise ValueError(f"{path} is not a safetensors file (header of {header_len} bytes)")
        header = json.loads(f.read(header_len))
    data = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=size)
    raw = torch.empty(0, dtype=torch.uint8).set_(data)
    base = 8 + header_len
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= size - base:
            raise ValueError(f"{path}: tensor {name!r} lies outside the file")
        part = raw[base + begin : base + end]
        if (base + begin) % dtype.itemsize:  # unaligned: this one tensor is copied
            part = part.clone()
        yield name, part.view(dtype).view(info["shape"])


def load_weights(model: LlamaForCausalLM, model_dir: str | Path) -> None:
    """Fill this rank's parameters, reading only its slices of each tensor."""
    loaded: set[str] = set()
    for path in find_weight_files(model_dir):
        for name, tensor in mapped_tensors(path):
            target = weight_target(model, name)
            if target is None:
                continue
            dst = target.param.data
            if target.dim is not None:  # slicing clamps: a short tensor fails the check below
                rows = slice(target.src_start, target.src_end)
                tensor = tensor[rows] if target.dim == 0 else tensor[:, rows]
                size = target.src_end - target.src_start
                dst = dst.narrow(target.dim, target.dst_start, size)
            if tuple(tensor.shape) != tuple(dst.shape):
                raise ValueError(
                    f"checkpoint tensor {name!r}: shard shape {tuple(tensor.shape)} "
                    f"does not match the model's {tuple(dst.shape)}"
                )
            if dst.shape == target.param.shape and _can_share(tensor, target.param):
                target.param.data = tensor
            else:
                dst.copy_(tensor)
            loaded.add(name)
    missing = expected_weight_names(model) - loaded
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks tensors: {sorted(missing)[:8]}")


def _can_share(tensor: torch.Tensor, param: torch.Tensor) -> bool:
    """A mapped tensor can be the parameter itself: on the CPU, the same dtype, dense, and
    aligned as the model's own memory is (64 bytes)."""
    return (param.device.type == "cpu" and tensor.dtype == param.dtype
            and tensor.is_contiguous() and tensor.data_ptr() % ALIGN_BYTES == 0)


def load_model(
    model_dir: str | Path, comm: Communicator, dtype: torch.dtype, device: torch.device | str
) -> LlamaForCausalLM:
    """Build this rank's shard and load its weights."""
    config = load_model_config(model_dir)
    config.check_tp(comm.world_size)
    model = LlamaForCausalLM(config, comm, dtype, device)
    load_weights(model, model_dir)
    if torch.device(device).type == "cpu":
        store_linear_weights_transposed(model)
    return model.eval()


def store_linear_weights_transposed(model: LlamaForCausalLM) -> None:
    """On the CPU, every linear weight keeps its [out, in] shape but is stored transposed:
    F.linear(x, w) multiplies by w.t(), a contiguous [in, out] matrix, and MKL's x @ W
    streams that layout ~1.4x faster than [out, in] for one row (a decode step; measured on
    smollm2's GEMVs: 35 ms a token against 50 ms). The copies leave the file mapping (the
    replicas of a host no longer share these pages). A tied LM head gets its own copy: the
    embedding keeps its rows contiguous for its lookups."""
    for module in model.modules():
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear, ParallelLMHead)):
            weight = module.weight.detach()
            module.weight = nn.Parameter(weight.t().contiguous().t(), requires_grad=False)
