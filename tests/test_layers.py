"""The import direction of the packages: router -> worker -> kv and kernels; the messages
that cross between router and engine live in protocol/, which imports none of them, so
router/core (which reads those messages) imports nothing of worker/. The layers of router/:
apps -> gateway, serve -> front -> cluster -> core; gateway and serve import neither the
other; apps, the Serve application builders, compose them. Checked in fresh interpreters,
so what one module imports is not hidden by what another test imported first."""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _imported_modules(package: str) -> set[str]:
    out: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.add(node.module)
    return out


@pytest.mark.parametrize("package, forbidden", [
    ("protocol", ("kv", "kernels", "worker", "router")),
    ("kv", ("router", "worker", "kernels")),
    ("kernels", ("router", "worker")),
    ("worker", ("router",)),
    ("router/core", ("router.cluster", "router.front", "router.serve", "router.gateway",
                     "router.apps", "worker", "ray", "torch", "fastapi")),
    ("router/cluster", ("router.serve", "router.gateway", "router.front", "router.apps")),
    ("router/front", ("router.serve", "router.gateway", "router.apps")),
    ("router/serve", ("router.gateway", "router.apps")),
    ("router/gateway", ("router.serve", "router.apps")),
])
def test_imports_run_one_way(package, forbidden):
    bad = sorted(m for m in _imported_modules(package)
                 if any(m == f or m.startswith(f + ".") for f in forbidden))
    assert bad == [], f"{package} imports {bad}"


@pytest.mark.parametrize("module, absent", [
    ("protocol.engine", ("torch", "ray", "fastapi", "numpy")),
    ("router.core.router", ("torch", "ray", "fastapi")),
    ("router.gateway.app", ("torch",)),
])
def test_light_layers_load_no_heavy_modules(module, absent):
    code = (f"import sys, {module}; loaded = [m for m in {absent!r} if m in sys.modules]; "
            f"assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
