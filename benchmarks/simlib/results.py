"""One benchmark's section of benchmarks/RESULTS.md, replaced in place (or appended)."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, heading: str, text: str) -> None:
    """Replaces the section that starts with `heading` (up to the next `## `) by `text`."""
    old = path.read_text() if path.exists() else "# kvroute benchmark results\n"
    start = old.find(heading)
    if start < 0:
        new = old.rstrip() + "\n\n" + text
    else:
        end = old.find("\n## ", start + len(heading))
        new = old[:start] + text + (old[end + 1:] if end >= 0 else "")
    path.write_text(new.rstrip() + "\n")
