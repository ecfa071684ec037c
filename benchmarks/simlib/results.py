"""One benchmark run saved as benchmarks/results/<name>.txt, with what reproduces it.

RESULTS.md is one page written by hand from these files; a script never edits it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=RESULTS_DIR,
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def save_result(name: str, text: str, results_dir: Path = RESULTS_DIR) -> Path:
    """Writes `text` to results_dir/<name>.txt under a header: the command, the UTC date,
    the git commit and the 1-minute load average at the end of the run. Returns the path."""
    load_1m, load_5m, _ = os.getloadavg()
    header = (f"# command: python {' '.join(sys.argv)}\n"
              f"# date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, commit {_commit()}, "
              f"load average {load_1m:.2f} (1 min) {load_5m:.2f} (5 min), "
              f"{os.cpu_count()} CPUs\n")
    path = results_dir / f"{name}.txt"
    path.write_text(header + text.rstrip() + "\n")
    return path
