"""One source per setting: a kvroute setting is read from the environment only by the
settings loader (worker/settings.py `load_settings`), through a settings model whose field
names the variable (`env_name`). No other module names a `KVROUTE_*` variable or reads one
itself; each process loads its settings once and passes them down."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kv", "kernels", "protocol", "worker", "router")
LOADER = Path("worker/settings.py")
VARIABLE = re.compile(r"KVROUTE_[A-Z][A-Z0-9_]*")
ENVIRON_READS = {"get", "getenv", "pop", "setdefault"}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value,
                                                                      ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _is_env_name(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "env_name")


def offences(path: Path) -> list[str]:
    """Where the module names a kvroute variable in code, or reads `env_name(...)` from an
    environment mapping itself."""
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings and VARIABLE.search(node.value)):
            found.append((node.lineno, f"names {VARIABLE.search(node.value)[0]}"))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ENVIRON_READS and node.args
                and _is_env_name(node.args[0])):
            found.append((node.lineno, "reads env_name(...) itself"))
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and _is_env_name(node.slice)):
            found.append((node.lineno, "reads env_name(...) itself"))
    return [f"{path}:{line}: {what}" for line, what in sorted(found)]


def test_only_the_settings_loader_reads_a_kvroute_variable():
    found = []
    for package in PACKAGES:
        for path in sorted(ROOT.joinpath(package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative != LOADER:
                found += offences(relative)
    assert found == []


def test_the_check_finds_a_direct_read(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Docs may name KVROUTE_CACHE_DIR."""\nimport os\n'
                      'from worker.settings import env_name\n'
                      'a = os.environ.get("KVROUTE_CACHE_DIR")\n'
                      'b = os.environ[env_name("cache_dir")]\n'
                      'c = os.getenv(env_name("cache_dir"))\n')
    assert [line.split(": ", 1)[1] for line in offences(module)] == [
        "names KVROUTE_CACHE_DIR", "reads env_name(...) itself", "reads env_name(...) itself"]
