"""Renders helm/kvroute with the real helm binary; the value sets the tests render."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "kvroute"
VALUES_DIR = Path(__file__).with_name("values")
RELEASE = "demo"
NAMESPACE = "llm"

# Name -> values files layered over the chart's values.yaml.
VALUE_SETS: dict[str, tuple[str, ...]] = {
    "default": (),
    "pvc-tp4": ("pvc-tp4.yaml",),
    "autoscaling": ("autoscaling.yaml",),
    "sim-minimal": ("sim-minimal.yaml",),
    "gateway": ("gateway.yaml",),
    "workers": ("workers.yaml",),
    "huggingface": ("huggingface.yaml",),
    "incremental": ("incremental.yaml",),
}


def _value_args(value_files: Sequence[str], set_values: Sequence[str]) -> list[str]:
    args = []
    for name in value_files:
        args += ["--values", str(VALUES_DIR / name)]
    for assignment in set_values:
        args += ["--set", assignment]
    return args


def run_helm(helm_bin: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_bin, *args], capture_output=True, text=True, timeout=60)


def template(helm_bin: str, value_files: Sequence[str] = (),
             set_values: Sequence[str] = ()) -> subprocess.CompletedProcess:
    return run_helm(helm_bin, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    *_value_args(value_files, set_values))


def render(helm_bin: str, value_files: Sequence[str] = (),
           set_values: Sequence[str] = ()) -> list[dict]:
    """The rendered manifests; raises AssertionError with helm's stderr if rendering fails."""
    result = template(helm_bin, value_files, set_values)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def lint(helm_bin: str, value_files: Sequence[str] = ()) -> subprocess.CompletedProcess:
    return run_helm(helm_bin, "lint", "--strict", str(CHART), "--namespace", NAMESPACE,
                    *_value_args(value_files, ()))


def notes(helm_bin: str, value_files: Sequence[str] = (),
          set_values: Sequence[str] = ()) -> str:
    """NOTES.txt as `helm install` prints it (client-side dry run: no cluster needed)."""
    result = run_helm(helm_bin, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                      "--dry-run=client", *_value_args(value_files, set_values))
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:\n", 1)[1]


def one(docs: list[dict], kind: str) -> dict:
    (doc,) = [doc for doc in docs if doc["kind"] == kind]
    return doc


def serve_config(docs: list[dict]) -> dict:
    return yaml.safe_load(one(docs, "RayService")["spec"]["serveConfigV2"])


def head_template(docs: list[dict]) -> dict:
    return one(docs, "RayService")["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]


def engine_group(docs: list[dict]) -> dict:
    (group,) = one(docs, "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return group
