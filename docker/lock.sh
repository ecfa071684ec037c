#!/usr/bin/env bash
# Pin the image's whole stack: docker/requirements-{cpu,cuda}.lock, every dependency of
# pyproject.toml resolved under constraints.txt for the image's platform (Linux x86_64,
# Debian bookworm's Python 3.11). The CPU lock keeps constraints.txt's `+cpu` torch (from the
# local wheel folder); the CUDA lock takes the same torch release from PyPI, whose Linux
# wheels are CUDA builds, and the `gpu` extra (Triton). Rerun after changing dependencies:
# tests/deploy/test_image.py fails while a lock misses one.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-$(python3 -m pip config get global.find-links 2>/dev/null || echo /opt/wheels)}
common=(--quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28
        --custom-compile-command docker/lock.sh)

uv pip compile "${common[@]}" pyproject.toml -c constraints.txt --find-links "$WHEELS" \
  -o docker/requirements-cpu.lock

# A fixed path (the lock's comments name it), in the git-ignored .cache/.
cuda_constraints=.cache/constraints-cuda.txt
mkdir -p .cache
sed 's/^\(torch==[^+]*\)+cpu$/\1/' constraints.txt >"$cuda_constraints"
uv pip compile "${common[@]}" pyproject.toml --extra gpu -c "$cuda_constraints" \
  -o docker/requirements-cuda.lock
grep -H -E '^torch==' docker/requirements-*.lock
