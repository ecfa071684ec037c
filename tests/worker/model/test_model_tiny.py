"""The embedded `tiny` checkpoint: deterministic, loadable by us and by transformers."""

from __future__ import annotations

import hashlib

import jinja2
import pytest
import torch
from tokenizers import Tokenizer

from tests.worker.model.model_harness import hf_logits, load_hf, make_runner, seq, step
from worker.model.loader import check_checkpoint
from worker.model.tiny import ensure_tiny, resolve_model
from worker.tokenizer.files import load_tokenizer_files


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_ensure_tiny_is_deterministic_and_cached(tmp_path):
    first = ensure_tiny(tmp_path / "a")
    second = ensure_tiny(tmp_path / "b")
    assert first == tmp_path / "a" / "tiny" and second == tmp_path / "b" / "tiny"
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert _digest(first / name) == _digest(second / name)
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny(tmp_path / "a") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime
    # only the finished directory is left behind, no staging copies
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["tiny"]
    # a copy from another version (or a half-written one) is rebuilt
    (first / ".kvroute-tiny-version").write_text("0")
    (first / "model.safetensors").write_bytes(b"junk")
    assert ensure_tiny(tmp_path / "a") == first
    assert _digest(first / "model.safetensors") == _digest(second / "model.safetensors")
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["tiny"]


def test_resolve_model(tmp_path, monkeypatch):
    monkeypatch.setenv("KVROUTE_CACHE_DIR", str(tmp_path))
    assert resolve_model("tiny") == tmp_path / "tiny"
    assert resolve_model(tmp_path / "tiny") == tmp_path / "tiny"
    with pytest.raises(FileNotFoundError,
                       match="neither 'tiny', 'smollm2', a checkpoint directory, a .gguf file "
                             "nor a Hugging Face repo id"):
        resolve_model(tmp_path / "missing")


def test_tiny_runs_and_matches_transformers(tmp_path):
    path = ensure_tiny(tmp_path)
    config = check_checkpoint(path, tp=2)
    assert (config.num_layers, config.hidden_size, config.num_heads) == (2, 64, 4)
    assert config.eos_token_ids == (257, 261)
    tokens = [256, *b"hello tiny"]
    logits = make_runner(path).execute(step(seq("a", tokens, 0, [0, 1, 2])))
    torch.testing.assert_close(logits[0], hf_logits(load_hf(path), tokens)[-1], atol=1e-4, rtol=0)


def test_tiny_tokenizer_and_chat_template(tmp_path):
    files = load_tokenizer_files(ensure_tiny(tmp_path))
    tokenizer = Tokenizer.from_file(str(files.tokenizer_path))
    assert tokenizer.encode("hé").ids == [256, 104, 195, 169]
    assert tokenizer.decode([256, 104, 195, 169]) == "hé"
    text = jinja2.Template(files.chat_template).render(
        messages=[{"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        bos_token=files.bos_token,
    )
    assert text == "<s><|user|>\nhi<|end|>\n<|assistant|>\n"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert ids == [256, 259, 10, 104, 105, 261, 10, 260, 10]


def test_kv_pool_sizing(tmp_path):
    from worker.executor.kv_cache import kv_block_bytes, num_blocks_for_memory

    config = check_checkpoint(ensure_tiny(tmp_path), tp=1)
    # 2 layers x (K, V) x 2 KV heads x head_dim 16 x 16 tokens x 4 bytes
    assert kv_block_bytes(config, 16, 1, torch.float32) == 8192
    assert kv_block_bytes(config, 16, 2, torch.bfloat16) == 2048  # one KV head per rank
    assert num_blocks_for_memory(config, 16, 1, torch.float32, 1 << 20) == 128
    runner = make_runner(ensure_tiny(tmp_path), num_blocks=10)
    assert runner.kv.device_kv.nbytes == 10 * kv_block_bytes(config, 4, 1, torch.float32)
