"""A directory written once under a temporary name and renamed into place.

Readers never see half of it, and processes racing to build the same one are safe: the
first rename wins and the others' identical copies are dropped. Torch-free (the gateway
builds the `tiny` tokenizer's directory through it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_dir_once(target: Path, write: Callable[[Path], None],
                   is_complete: Callable[[Path], bool]) -> Path:
    """Returns `target`, first building it with `write(staging_dir)` unless `is_complete`.

    A `target` that exists but is not complete (stale or broken) is moved aside first.
    """
    if is_complete(target):
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        write(staging)
        if target.exists() and not is_complete(target):
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}-stale-", dir=root))
            os.replace(target, stale / target.name)
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(staging, target)
    except OSError:  # another process renamed its identical copy into place first
        if not is_complete(target):
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
