"""docker/Dockerfile and the chart's image agree with the repository: the image copies every
package, its build context keeps them, and the chart's default tag is what the build tags.
(Building the image is docker/build-local.sh's job: too slow for the test suite.)"""

import re

import pytest
import yaml

from .helm_chart import CHART, REPO, VALUE_SETS, engine_group, head_template, render

DOCKERFILE = REPO / "docker" / "Dockerfile"


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")))
    return [(parts[0].upper(), parts[1] if len(parts) > 1 else "")
            for parts in (line.split(None, 1) for line in joined.splitlines()) if parts]


def pyproject_value(key: str) -> str:
    """A one-line `key = value` of pyproject.toml (tomllib is not in Python 3.10)."""
    (value,) = re.findall(rf"^{key} = (.+)$", (REPO / "pyproject.toml").read_text(), re.M)
    return value


def packages() -> set[str]:
    """Top-level import packages pyproject's setuptools `find` includes."""
    patterns = re.findall(r'"([^"]+)"', pyproject_value("include"))
    return {path.parent.name for path in REPO.glob("*/__init__.py")
            if any(re.fullmatch(p.replace("*", ".*"), path.parent.name) for p in patterns)}


def copied_sources() -> set[str]:
    sources = set()
    for name, args in instructions(DOCKERFILE.read_text()):
        if name == "COPY" and "--from" not in args:
            sources.update(args.split()[:-1])
    return sources


def test_instructions_parse_continuations():
    text = "# c\nFROM a AS b\nRUN x \\\n  && y\n\nCOPY p q /d/\n"
    assert instructions(text) == [("FROM", "a AS b"), ("RUN", "x    && y"),
                                  ("COPY", "p q /d/")]


def test_the_image_copies_every_package_and_what_the_install_reads():
    assert {"kv", "router"} <= packages()
    assert copied_sources() == packages() | {"pyproject.toml", "constraints.txt", "README.md"}


def test_the_build_context_keeps_what_the_image_copies():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert ".venv" in ignored and ".git" in ignored
    assert not copied_sources() & ignored


def test_the_image_runs_kvroute_as_a_non_root_user():
    steps = instructions(DOCKERFILE.read_text())
    assert ("ENTRYPOINT", '["/usr/bin/tini", "--", "kvroute"]') in steps
    users = [args for name, args in steps if name == "USER"]
    assert users == ["1000"]


def test_the_chart_default_tag_is_the_built_tag():
    """build-local.sh tags `<pyproject version>-cpu`; the chart's default tag is
    `<appVersion>-<variant>`, so the two versions must be one."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert f'"{chart["appVersion"]}"' == pyproject_value("version")


def images(docs: list[dict]) -> set[str]:
    pods = [head_template(docs), engine_group(docs)["template"]]
    return {c["image"] for pod in pods for c in pod["spec"]["containers"]}


@pytest.mark.parametrize(("value_set", "set_values", "image"), [
    ("default", (), "localhost/kvroute:0.1.0-cuda"),
    ("sim-minimal", (), "localhost/kvroute:0.1.0-cpu"),
    ("sim-minimal", ("image.repository=registry.example/llm/kvroute", "image.tag=abc123"),
     "registry.example/llm/kvroute:abc123"),
])
def test_chart_image_follows_the_engine_mode(helm_bin, value_set, set_values, image):
    assert images(render(helm_bin, VALUE_SETS[value_set], set_values)) == {image}
