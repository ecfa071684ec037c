"""docker/Dockerfile and the chart's image agree with the repository: the image copies every
package, its build context keeps them, and the chart's default tag is what the build tags.
(Building the image is docker/build-local.sh's job: too slow for the test suite.)"""

import re

import pytest
import yaml

from .helm_chart import CHART, REPO, VALUE_SETS, engine_group, head_template, render

DOCKERFILE = REPO / "docker" / "Dockerfile"
LOCKS = {variant: REPO / "docker" / f"requirements-{variant}.lock" for variant in ("cpu", "cuda")}


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
    assert copied_sources() == packages() | {
        "pyproject.toml", "README.md", "docker/requirements-cpu.lock",
        "docker/requirements-cuda.lock"}


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


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock_text: str) -> dict[str, str]:
    return {normalized(name): version
            for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", lock_text, re.M)}


def requirement_names(block: str) -> set[str]:
    """Distribution names in a pyproject requirement list (`"ray[serve]==2.60.0", ...`)."""
    return {normalized(re.match(r"[A-Za-z0-9_.-]+", req).group())
            for req in re.findall(r'"([^"]+)"', block)}


def pyproject_list(key: str) -> str:
    """The inside of `key = [...]`, written on one line or one item a line."""
    text = (REPO / "pyproject.toml").read_text()
    (block,) = (re.findall(rf"^{key} = \[\n(.*?)^\]", text, re.M | re.S)
                or re.findall(rf"^{key} = \[(.*)\]$", text, re.M))
    return block


@pytest.mark.parametrize("variant", sorted(LOCKS))
def test_the_lock_pins_every_dependency_and_the_constraints(variant):
    """docker/lock.sh's output is in step with pyproject.toml and constraints.txt."""
    locked = pins(LOCKS[variant].read_text())
    needed = requirement_names(pyproject_list("dependencies"))
    if variant == "cuda":
        needed |= requirement_names(pyproject_list("gpu"))
    assert needed >= {"torch", "ray", "xxhash"}
    missing = sorted(needed - locked.keys())
    assert not missing, f"rerun docker/lock.sh: {LOCKS[variant].name} misses {missing}"
    for name, version in pins((REPO / "constraints.txt").read_text()).items():
        expected = version if variant == "cpu" else version.removesuffix("+cpu")
        assert locked[name] == expected, f"rerun docker/lock.sh: {name} in {variant}"


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
def test_chart_image_follows_the_engine(helm_bin, value_set, set_values, image):
    assert images(render(helm_bin, VALUE_SETS[value_set], set_values)) == {image}
