"""Models named by a Hugging Face repo id, resolved offline from a hub cache the test lays out
the way huggingface_hub does (models--ORG--NAME/{refs,snapshots}): no network."""

import shutil
from pathlib import Path

import openai
import pytest

from benchmarks.simlib.engine_workers import EngineWorker
from worker.engine.config import EngineConfig, default_served_name
from worker.model.hf_hub import is_repo_id, repo_name, snapshot_dir
from worker.model.tiny import ensure_tiny
from worker.tokenizer.files import checkpoint_dir, load_tokenizer_files

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache_with_tiny(root: Path, repo: str = "acme/tiny-llama",
                        refs: tuple[str, ...] = ("main",)) -> Path:
    """A hub cache holding the embedded tiny checkpoint as `repo` at COMMIT."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / COMMIT
    shutil.copytree(ensure_tiny(root / "kvroute-cache"), snapshot)
    (repo_dir / "refs").mkdir(parents=True)
    for ref in refs:
        (repo_dir / "refs" / ref).write_text(COMMIT)
    return root


@pytest.mark.parametrize("spec, expected", [
    ("acme/tiny-llama", True), ("meta-llama/Llama-3.1-8B-Instruct", True),
    ("acme/tiny-llama@v1.0", True), ("tiny", False), ("/models/llama", False),
    ("./acme/tiny", False), ("a/b/c", False), ("acme/", False),
])
def test_is_repo_id(spec, expected):
    assert is_repo_id(spec) is expected


def test_an_existing_relative_directory_is_not_a_repo_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "acme" / "tiny-llama").mkdir(parents=True)
    assert not is_repo_id("acme/tiny-llama")
    assert checkpoint_dir("acme/tiny-llama") == Path("acme/tiny-llama")


def test_served_name_of_a_repo_id_is_the_repo_id_without_revision():
    assert repo_name("acme/tiny-llama@v1.0") == "acme/tiny-llama"
    assert default_served_name("acme/tiny-llama@v1.0") == "acme/tiny-llama"
    assert default_served_name("/models/llama-3-8b/") == "llama-3-8b"
    assert EngineConfig(model="acme/tiny-llama").served_model_name == "acme/tiny-llama"
    assert EngineConfig(model="acme/tiny-llama", served_model_name="llama").served_model_name == (
        "llama")


def test_snapshot_found_offline_by_branch_and_by_commit(tmp_path):
    cache = hub_cache_with_tiny(tmp_path, refs=("main", "v1.0"))
    snapshot = cache / "models--acme--tiny-llama" / "snapshots" / COMMIT
    for spec in ("acme/tiny-llama", "acme/tiny-llama@v1.0", f"acme/tiny-llama@{COMMIT}"):
        assert snapshot_dir(spec, cache_dir=cache, offline=True) == snapshot
    assert snapshot_dir("acme/tiny-llama", weights=False, cache_dir=cache,
                        offline=True) == snapshot
    assert load_tokenizer_files(snapshot).tokenizer_path == snapshot / "tokenizer.json"


@pytest.mark.parametrize("spec", ["acme/missing", "acme/tiny-llama@v9"])
def test_a_repo_missing_from_the_cache_offline_names_the_repo(tmp_path, spec):
    cache = hub_cache_with_tiny(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"model '{spec}': no checkpoint in the local"):
        snapshot_dir(spec, cache_dir=cache, offline=True)


def test_kvroute_engine_serves_a_repo_id_from_the_hub_cache(tmp_path, monkeypatch):
    """The real engine loads tokenizer and weights from the cache through $HF_HUB_CACHE,
    offline, and serves the model under its repo id."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache_with_tiny(tmp_path)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    worker = EngineWorker.start(("--model", "acme/tiny-llama", "--num-blocks", "64"))
    try:
        client = openai.OpenAI(base_url=worker.base_url, api_key="unused", timeout=60,
                               max_retries=0)
        assert [m.id for m in client.models.list().data] == ["acme/tiny-llama"]
        completion = client.completions.create(model="acme/tiny-llama", prompt="Hello",
                                               max_tokens=4, extra_body={"ignore_eos": True})
        assert completion.model == "acme/tiny-llama"
        assert completion.usage.completion_tokens == 4
    finally:
        assert worker.stop() == 0
