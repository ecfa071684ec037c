"""Binaries the deploy tests run. tests/setup_system.sh installs them (`make test` calls it);
a missing one fails the test loudly instead of skipping it, because CI always has them."""

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HELM_PATH = REPO / ".cache" / "bin" / "helm"
# The console script of the environment running the tests (.venv/bin/kvroute).
KVROUTE_PATH = Path(sys.executable).with_name("kvroute")


def _require(found: str | None, what: str) -> str:
    if found is None:
        pytest.fail(f"{what} not found: run `bash tests/setup_system.sh`", pytrace=False)
    return found


@pytest.fixture(scope="session")
def helm_bin() -> str:
    return _require(str(HELM_PATH) if HELM_PATH.is_file() else None, f"helm ({HELM_PATH})")


@pytest.fixture(scope="session")
def promtool_bin() -> str:
    return _require(shutil.which("promtool"), "promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return _require(shutil.which("prometheus"), "prometheus")


@pytest.fixture(scope="session")
def kvroute_bin() -> str:
    return _require(str(KVROUTE_PATH) if KVROUTE_PATH.is_file() else None,
                    f"kvroute ({KVROUTE_PATH})")
