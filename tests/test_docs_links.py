"""Every cross-reference in the user-facing Markdown resolves: relative links (and their
#anchors), the repository paths the text names, in backticks or bare, and the sections of
the benchmark results that docs and code cite by name (`NOTEBOOK.md, "Title"`,
`RESULTS.md, section 5`).

A doc that names a file which moved or was deleted sends a reader nowhere; this fails on
the first such reference, with the doc and line. The notebook (benchmarks/NOTEBOOK.md) is
history kept as written: its links must resolve, but the paths its prose names are the
tree of the day they were measured, so only its links are checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/*.md")])
HISTORY = {ROOT / "benchmarks" / "NOTEBOOK.md"}  # links checked, named paths not

# A path that starts with a top-level folder of the repository (or, in benchmarks/*.md, a
# folder of benchmarks/) names a file or folder.
TOP_DIRS = ("kv", "kernels", "protocol", "worker", "router", "benchmarks", "tests", "docs",
            "helm", "dashboards", "docker", "results", "simlib", "peers", "hostile")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP_DIRS) + r")/[\w./-]*[\w/])")
# A path with a placeholder in it (or right after it) names a family of files, not one.
PLACEHOLDER = re.compile(r"\bW_|\bWORKLOAD_|\bNAME\b|\.\.\.")
PLACEHOLDER_AFTER = "[<{*"


def github_anchor(heading: str) -> str:
    """The #fragment GitHub gives a Markdown heading."""
    text = heading.strip().lstrip("#").strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.replace("`", ""))
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    return {github_anchor(line) for line in _prose_lines(doc)
            if line.startswith("#")}


def _prose_lines(doc: Path) -> list[str]:
    """The doc's lines, with fenced code blocks blanked (commands and output, not links)."""
    lines, fenced = [], False
    for line in doc.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def broken_links(doc: Path) -> list[str]:
    broken = []
    for number, line in enumerate(_prose_lines(doc), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path_part, _, fragment = target.partition("#")
            path = (doc.parent / path_part).resolve() if path_part else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}:{number}: no file {target}")
            elif fragment and path.suffix == ".md" and fragment not in anchors(path):
                broken.append(f"{doc.relative_to(ROOT)}:{number}: no heading #{fragment} "
                              f"in {path.relative_to(ROOT)}")
    return broken


def named_paths(line: str) -> list[str]:
    """Repository paths a line names, in backticks (a command's script included) or bare."""
    paths = []
    for match in PATH.finditer(line):
        after = line[match.end():match.end() + 1]
        if not PLACEHOLDER.search(match.group(1)) and (not after or after not in
                                                      PLACEHOLDER_AFTER):
            paths.append(match.group(1))
    return paths


def missing_paths(doc: Path) -> list[str]:
    missing = []
    for number, line in enumerate(_prose_lines(doc), 1):
        for path in named_paths(line):
            if not ((ROOT / path).exists() or (doc.parent / path).exists()):
                missing.append(f"{doc.relative_to(ROOT)}:{number}: no path {path}")
    return missing


# A cited section: `RESULTS.md, "Title"`, `(notebook, "Title")`, `RESULTS.md, section 5`.
SECTION_REF = re.compile(r"\b(RESULTS\.md|NOTEBOOK\.md|notebook),? "
                         r"(?:\"([^\"]+)\"|section (\d+)\b)")
BENCHMARK_DOCS = {"RESULTS.md": ROOT / "benchmarks" / "RESULTS.md",
                  "NOTEBOOK.md": ROOT / "benchmarks" / "NOTEBOOK.md",
                  "notebook": ROOT / "benchmarks" / "NOTEBOOK.md"}
CITING = [*DOCS, ROOT / "helm" / "kvroute" / "values.yaml",
          *(p for top in TOP_DIRS[:6] for p in (ROOT / top).rglob("*.py"))]


def headings(doc: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in _prose_lines(doc) if line.startswith("#")]


def unknown_sections(text: str, where: str) -> list[str]:
    """Cited sections with no heading that starts with the title (or `N.` for a number).
    The text's line breaks and comment markers are joined first: a title may wrap."""
    text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)
    unknown = []
    for name, title, number in SECTION_REF.findall(text):
        prefix = title or f"{number}."
        if not any(h.startswith(prefix) for h in headings(BENCHMARK_DOCS[name])):
            unknown.append(f"{where}: no section {prefix!r} in {name}")
    return unknown


def test_the_checks_find_what_is_broken(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Title here\n[ok](doc.md#title-here) [gone](nope.md) "
                   "[bad anchor](doc.md#nope) [web](https://example.com)\n"
                   "```\n[in a fence](nope.md)\n```\n")
    assert [b.split(": ", 1)[1] for b in broken_links_in(doc, tmp_path)] == [
        "no file nope.md", "no heading #nope in doc.md"]
    assert named_paths("see `kv/hashing.py` and router/core/gone.py, `benchmarks/W_rN.txt`, "
                       "results/gateways_<workload>.txt, results/X_rN[TAG].json.") \
        == ["kv/hashing.py", "router/core/gone.py"]
    assert github_anchor("## 5. What does the router path cost?") == \
        "5-what-does-the-router-path-cost"
    assert unknown_sections('(notebook, "End to\n    # end") RESULTS.md, section 5 '
                            '(RESULTS.md, "No such") NOTEBOOK.md, section 99', "x") == [
        "x: no section 'No such' in RESULTS.md", "x: no section '99.' in NOTEBOOK.md"]


def broken_links_in(doc: Path, root: Path) -> list[str]:
    global ROOT
    saved, ROOT = ROOT, root
    try:
        return broken_links(doc)
    finally:
        ROOT = saved


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_links_resolve(doc):
    assert broken_links(doc) == []


@pytest.mark.parametrize("doc", [d for d in DOCS if d not in HISTORY],
                         ids=lambda d: str(d.relative_to(ROOT)))
def test_named_paths_exist(doc):
    assert missing_paths(doc) == []


def test_cited_sections_exist():
    unknown = []
    for path in CITING:
        if path != Path(__file__).resolve():
            unknown += unknown_sections(path.read_text(), str(path.relative_to(ROOT)))
    assert unknown == []


def test_every_benchmark_script_is_indexed():
    """benchmarks/README.md answers "which script measures X": a script missing from it is
    one nobody finds. Add a row under the question the new script answers."""
    index = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
    assert [name for name in scripts if f"[{name}]({name})" not in index] == []
