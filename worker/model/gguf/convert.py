"""Each GGUF file converted once into a cached Hugging Face checkpoint directory.

    <cache root>/gguf/<file stem>-<key>/            config.json, generation_config.json,
                                                    model.safetensors, tokenizer files
    <cache root>/gguf/<file stem>-<key>-tokenizer/  tokenizer.json, tokenizer_config.json

`key` hashes the file's resolved path, size and modification time (and the converter's
version), so a replaced file converts again and an unchanged one never does. The
tokenizer-only directory is what the gateway needs: metadata only, no weight is read.
Directories are staged and renamed into place (worker/model/staged_dir.py), so racing replicas
and a half-finished conversion are safe.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from worker.model.gguf import reader as gguf_reader
from worker.model.gguf.aligned_safetensors import save_aligned
from worker.model.gguf.tokenizer import write_tokenizer
from worker.model.staged_dir import build_dir_once

# Bump when the conversion's output changes, so stale caches are rebuilt. (Its weights'
# data starts on a 64-byte boundary since, so the loader maps them instead of copying; an
# older conversion is not stale: its weights are copied.)
CONVERTER_VERSION = "1"
_MARKER = ".kvroute-gguf"


def cache_key(path: Path) -> str:
    """Identity of the file: resolved path, size and mtime; 16 hex digits."""
    stat = path.stat()
    ident = f"{CONVERTER_VERSION}\0{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _require_file(path: str | Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    return path


def _is_complete(target: Path) -> bool:
    marker = target / _MARKER
    return marker.is_file() and marker.read_text() == CONVERTER_VERSION


def _write_checkpoint(path: Path, out_dir: Path) -> None:
    reader = gguf_reader.open_gguf(path)
    config = gguf_reader.hf_config(reader)
    write_tokenizer(reader, out_dir)
    tensors = dict(gguf_reader.hf_tensors(reader, config))
    save_aligned(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    (out_dir / _MARKER).write_text(CONVERTER_VERSION)


def _write_tokenizer_only(path: Path, out_dir: Path) -> None:
    reader = gguf_reader.open_gguf(path)
    gguf_reader.architecture(reader)  # an unsupported file fails here, not in the engine
    write_tokenizer(reader, out_dir)
    (out_dir / _MARKER).write_text(CONVERTER_VERSION)


def _target(path: Path, cache_root: Path, suffix: str) -> Path:
    return cache_root / "gguf" / f"{path.stem}-{cache_key(path)}{suffix}"


def gguf_checkpoint_dir(path: str | Path, cache_root: Path) -> Path:
    """The converted checkpoint of GGUF file `path`, converting it on first use."""
    path = _require_file(path)
    return build_dir_once(_target(path, cache_root, ""),
                          lambda out: _write_checkpoint(path, out), _is_complete)


def gguf_tokenizer_dir(path: str | Path, cache_root: Path) -> Path:
    """A directory with the tokenizer files of GGUF file `path` (no weights dequantized):
    the full conversion when it exists already, else a tokenizer-only one."""
    path = _require_file(path)
    full = _target(path, cache_root, "")
    if _is_complete(full):
        return full
    return build_dir_once(_target(path, cache_root, "-tokenizer"),
                          lambda out: _write_tokenizer_only(path, out), _is_complete)
