"""Checkpoints named by a Hugging Face repo id (`org/name`, or `org/name@revision`).

huggingface_hub fetches the repo's checkpoint files into its cache on first use and finds
them there afterwards: `$HF_HUB_CACHE` (default `$HF_HOME/hub`, `~/.cache/huggingface/hub`),
which a deployment puts on a shared volume so each node downloads once. `HF_HUB_OFFLINE=1`
reads the cache only; `HF_TOKEN` opens gated repos. Imports no torch (the gateway uses it for
the tokenizer files).
"""

from __future__ import annotations

import re
from pathlib import Path

# What the engine reads of a checkpoint (worker/model/loader.py, worker/tokenizer/files.py): the
# configs, the tokenizer and its chat template, and the safetensors weights.
TOKENIZER_PATTERNS = ("*.json", "*.jinja")
WEIGHT_PATTERNS = ("*.safetensors",)

_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")


def is_repo_id(name_or_path: str | Path) -> bool:
    """True for `org/name[@revision]` that is not a local path (an existing relative
    directory `org/name` stays a directory)."""
    spec = str(name_or_path)
    return bool(_REPO_ID.match(spec)) and not Path(spec).expanduser().exists()


def repo_name(spec: str) -> str:
    """The repo id without its revision: the name the API serves the model under."""
    match = _REPO_ID.match(spec)
    if match is None:
        raise ValueError(f"{spec!r} is not a Hugging Face repo id (org/name[@revision])")
    return match["repo"]


def snapshot_dir(spec: str, *, weights: bool = True, cache_dir: str | Path | None = None,
                 offline: bool | None = None) -> Path:
    """The local snapshot directory of repo `spec`, downloaded into the cache if missing.

    Args:
        weights: also the *.safetensors files (False: configs and tokenizer only).
        cache_dir: the hub cache (None: huggingface_hub's, from $HF_HUB_CACHE / $HF_HOME).
        offline: read the cache only (None: huggingface_hub's $HF_HUB_OFFLINE).

    Raises FileNotFoundError naming the repo when it cannot be found or fetched.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    match = _REPO_ID.match(spec)
    if match is None:
        raise ValueError(f"{spec!r} is not a Hugging Face repo id (org/name[@revision])")
    patterns = list(TOKENIZER_PATTERNS + (WEIGHT_PATTERNS if weights else ()))
    try:
        path = snapshot_download(match["repo"], revision=match["revision"],
                                 cache_dir=cache_dir, allow_patterns=patterns,
                                 local_files_only=bool(offline))
    except (HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, OSError) as err:
        where = "in the local Hugging Face cache" if offline else "on the Hugging Face Hub"
        raise FileNotFoundError(f"model {spec!r}: no checkpoint {where} "
                                f"({type(err).__name__}: {err})") from None
    return Path(path)
