"""Checkpoint loading: clear errors for what cannot be served, sharded files, config parsing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.worker.model.model_harness import CONFIGS, make_runner, prompt, seq, step
from worker.model.config import ModelConfig
from worker.model.loader import check_checkpoint, find_weight_files, load_model_config
from worker.model.random_checkpoint import write_random_checkpoint


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("llama"), CONFIGS["llama"], seed=0)


def _copy_with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_unsupported_architecture(llama_dir, tmp_path):
    path = _copy_with_config(llama_dir, tmp_path / "m", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        check_checkpoint(path, tp=1)


def test_unsupported_rope_type(llama_dir, tmp_path):
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    path = _copy_with_config(llama_dir, tmp_path / "m", rope_parameters=rope)
    with pytest.raises(ValueError, match="unsupported rope type 'yarn'"):
        load_model_config(path)


def test_missing_directory_config_and_weights(llama_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_checkpoint(tmp_path / "nowhere", tp=1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        check_checkpoint(tmp_path / "empty", tp=1)
    shutil.copy(llama_dir / "config.json", tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match=r"has no \*\.safetensors weight files"):
        check_checkpoint(tmp_path / "empty", tp=1)
    shutil.copy(llama_dir / "model.safetensors", tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json"):
        check_checkpoint(tmp_path / "empty", tp=1)


def test_tp_must_divide_heads(llama_dir):
    # 4 attention heads, 2 KV heads, intermediate size 128
    with pytest.raises(ValueError, match=r"size 3 does not divide num_attention_heads \(4\)"):
        check_checkpoint(llama_dir, tp=3)
    with pytest.raises(ValueError, match=r"size 4 does not divide num_key_value_heads \(2\)"):
        check_checkpoint(llama_dir, tp=4)
    assert check_checkpoint(llama_dir, tp=2).num_kv_heads == 2


def test_missing_tensor_is_named(llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    path = tmp_path / "m"
    shutil.copytree(llama_dir, path)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"lacks tensors: \['model.layers.1.mlp.up_proj"):
        make_runner(path)


def test_sharded_checkpoint_with_index_loads_the_same(llama_dir, tmp_path):
    sharded = write_random_checkpoint(
        tmp_path / "s", CONFIGS["llama"], seed=0, max_shard_size="40KB"
    )
    assert len(find_weight_files(sharded)) > 1
    tokens = prompt(6, seed=1)
    one = make_runner(llama_dir).execute(step(seq("a", tokens, 0, [0, 1])))
    many = make_runner(sharded).execute(step(seq("a", tokens, 0, [0, 1])))
    assert torch.equal(one, many)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    (sharded / sorted(set(index["weight_map"].values()))[0]).unlink()
    with pytest.raises(FileNotFoundError, match="lists missing files"):
        find_weight_files(sharded)


def test_config_parsing_of_old_and_new_fields():
    base = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32768,
        vocab_size=300,
    )
    # transformers 4 style: rope_theta and rope_scaling with "type"; eos as a list
    old = ModelConfig.from_hf(
        dict(
            base,
            architectures=["LlamaForCausalLM"],
            rope_theta=500000.0,
            eos_token_id=[2, 9],
            rope_scaling=dict(
                type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8192,
            ),
        ),
        generation={"eos_token_id": [9, 11]},
    )
    assert (old.rope_theta, old.rope_scaling.factor, old.num_kv_heads) == (500000.0, 8.0, 4)
    assert old.eos_token_ids == (2, 9, 11)
    assert (old.head_dim, old.qkv_bias, old.o_proj_bias) == (16, False, False)
    # Mistral v0.1's sliding window caps the served length; Qwen2 has q/k/v biases only
    mistral = ModelConfig.from_hf(dict(base, model_type="mistral", sliding_window=4096))
    assert mistral.max_model_len_tokens == 4096
    qwen = ModelConfig.from_hf(
        dict(
            base, architectures=["Qwen2ForCausalLM"], sliding_window=4096, use_sliding_window=False
        )
    )
    assert (qwen.qkv_bias, qwen.o_proj_bias, qwen.max_model_len_tokens) == (True, False, 32768)
    with pytest.raises(ValueError, match="unsupported hidden_act 'gelu'"):
        ModelConfig.from_hf(dict(base, model_type="llama", hidden_act="gelu"))


def test_weights_equal_the_files_tensors_and_the_file_is_never_written(llama_dir):
    from safetensors.torch import load_file

    path = llama_dir / "model.safetensors"
    before = path.read_bytes()
    for dtype, torch_dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        model = make_runner(llama_dir, dtype=dtype).model
        layer = model.layers[1]
        reference = {name: t.to(torch_dtype) for name, t in load_file(path).items()}
        assert torch.equal(layer.self_attn.o_proj.weight,
                           reference["model.layers.1.self_attn.o_proj.weight"])
        assert torch.equal(layer.mlp.gate_up_proj.weight,
                           torch.cat([reference["model.layers.1.mlp.gate_proj.weight"],
                                      reference["model.layers.1.mlp.up_proj.weight"]]))
        assert torch.equal(model.embed_tokens.weight, reference["model.embed_tokens.weight"])
        for param in model.parameters():
            param.data.fill_(7.0)  # a mapped one is copy-on-write
    assert path.read_bytes() == before


def test_an_aligned_file_is_mapped_and_computes_as_a_copied_one(llama_dir, tmp_path):
    from safetensors.numpy import load_file

    from worker.model.gguf.aligned_safetensors import save_aligned

    aligned = tmp_path / "aligned"
    shutil.copytree(llama_dir, aligned)
    save_aligned(load_file(llama_dir / "model.safetensors"), aligned / "model.safetensors")
    file_bytes = (aligned / "model.safetensors").stat().st_size
    mapped = make_runner(aligned)
    layer = mapped.model.layers[0]
    # whole tensors in the model's dtype: parts of the one mapping, no copy
    for param in (mapped.model.embed_tokens.weight, layer.input_layernorm.weight):
        assert param.untyped_storage().nbytes() == file_bytes
    # linear weights (fused or whole, and the LM head) are stored transposed on the
    # CPU, in the model's own memory: [out, in] views of contiguous [in, out] matrices
    for param in (layer.mlp.gate_up_proj.weight, layer.self_attn.o_proj.weight,
                  layer.mlp.down_proj.weight, mapped.model.lm_head.weight):
        assert param.t().is_contiguous() and not param.is_contiguous()
        assert param.untyped_storage().nbytes() == param.numel() * param.element_size()
    # in bfloat16 nothing is mapped: every tensor is converted into the model's memory
    bf16 = make_runner(aligned, dtype="bfloat16").model.layers[0].self_attn.o_proj.weight
    assert bf16.untyped_storage().nbytes() == bf16.numel() * 2
    # the same logits, bit for bit, as every weight copied into the model's own memory
    copied = make_runner(llama_dir)
    for param in copied.model.parameters():
        param.data = param.data.clone()
    tokens = prompt(6, seed=1)
    assert torch.equal(mapped.execute(step(seq("a", tokens, 0, [0, 1]))),
                       copied.execute(step(seq("a", tokens, 0, [0, 1]))))


def test_a_file_that_is_not_safetensors_is_a_clear_error(llama_dir, tmp_path):
    path = tmp_path / "m"
    shutil.copytree(llama_dir, path)
    (path / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="is not a safetensors file"):
        make_runner(path)
