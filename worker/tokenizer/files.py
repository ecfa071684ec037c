"""A checkpoint's tokenizer files, read without torch (the gateway imports this).

`tokenizer_dir` names the directory holding tokenizer.json: the checkpoint itself, or for
the embedded `tiny` model a directory with only its byte-level tokenizer (written on first
use; the weights, which need torch, are the engine's business).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.model.gguf.builtin import SMOLLM2_NAME, is_gguf_path
from worker.model.hf_hub import is_repo_id, snapshot_dir
from worker.model.staged_dir import build_dir_once
from worker.process_settings import default_cache_root
from worker.tokenizer.byte_tokenizer import write_byte_tokenizer

TINY_NAME = "tiny"
TINY_MAX_POSITION_EMBEDDINGS = 2048


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer_path: Path  # tokenizer.json, for tokenizers.Tokenizer.from_file
    chat_template: str | None  # Jinja source, None when the checkpoint has none
    bos_token: str | None
    eos_token: str | None


def read_json(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return json.load(f)


def require_dir(model_dir: str | Path) -> Path:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} does not exist")
    return model_dir


def checkpoint_dir(name_or_path: str | Path, *, weights: bool = True) -> Path:
    """A checkpoint named by the user (not `tiny`): a directory, checked to exist; a Hugging
    Face repo id, fetched into (or found in) the hub cache (worker/model/hf_hub.py); a GGUF file
    or the built-in `smollm2` (a packaged GGUF), converted once into the cache
    (worker/model/gguf/). With `weights` False only its configs and tokenizer are fetched, or
    converted."""
    if str(name_or_path) == SMOLLM2_NAME or is_gguf_path(name_or_path):
        return _gguf_dir(name_or_path, weights)
    if is_repo_id(name_or_path):
        return snapshot_dir(str(name_or_path), weights=weights)
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"model {str(name_or_path)!r} is neither {TINY_NAME!r}, "
                                f"{SMOLLM2_NAME!r}, a checkpoint directory, a .gguf file nor "
                                f"a Hugging Face repo id")
    return path


def _gguf_dir(name_or_path: str | Path, weights: bool) -> Path:
    # Imported here: the gguf reader is needed only by GGUF models.
    from worker.model.gguf.builtin import smollm2_gguf_path
    from worker.model.gguf.convert import gguf_checkpoint_dir, gguf_tokenizer_dir

    path = smollm2_gguf_path() if str(name_or_path) == SMOLLM2_NAME else Path(name_or_path)
    convert = gguf_checkpoint_dir if weights else gguf_tokenizer_dir
    return convert(path, default_cache_root())


def tokenizer_dir(name_or_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The directory with the model's tokenizer.json ('tiny': its byte tokenizer only)."""
    if str(name_or_path) != TINY_NAME:
        return checkpoint_dir(name_or_path, weights=False)
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    return build_dir_once(
        root / "tiny-tokenizer",
        lambda staging: write_byte_tokenizer(staging, TINY_MAX_POSITION_EMBEDDINGS),
        lambda target: (target / "tokenizer_config.json").is_file())


def load_tokenizer_files(model_dir: str | Path) -> TokenizerFiles:
    model_dir = require_dir(model_dir)
    tokenizer_path = model_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise FileNotFoundError(f"{model_dir} has no tokenizer.json")
    config_path = model_dir / "tokenizer_config.json"
    tok_config = read_json(config_path) if config_path.is_file() else {}
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
