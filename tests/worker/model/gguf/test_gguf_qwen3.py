"""A Qwen3 GGUF in llama.cpp's layout (its tensor names, q/k rows not permuted, head_dim in
`qwen3.attention.key_length`) converts into a checkpoint the engine runs exactly as
transformers runs the model it came from."""

import torch
from gguf import GGUFWriter

from tests.worker.model.gguf.tiny_gguf import MERGES, SPECIALS, TOKENS
from tests.worker.model.model_harness import hf_logits, make_runner, seq, step
from worker.model.gguf.convert import gguf_checkpoint_dir
from worker.model.loader import load_model_config
from worker.model.random_weights import random_tensor

SHAPE = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=32, ffn=128, context=256)
# llama.cpp's per-layer names for the HF ones (convert_hf_to_gguf.py's Qwen3 mapping)
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def random_qwen3():
    """transformers' Qwen3 (tied embeddings, head_dim 32 != 64 / 4) with seeded weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(TOKENS), hidden_size=SHAPE["hidden"], intermediate_size=SHAPE["ffn"],
        num_hidden_layers=SHAPE["layers"], num_attention_heads=SHAPE["heads"],
        num_key_value_heads=SHAPE["kv_heads"], head_dim=SHAPE["head_dim"],
        max_position_embeddings=SHAPE["context"], rms_norm_eps=1e-5, rope_theta=1e6,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
    )
    model = Qwen3ForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            param.copy_(random_tensor(name, tuple(param.shape), gen))
    return model


def write_qwen3_gguf(path, model) -> None:
    """The F32 GGUF llama.cpp writes for this model (tied: no output.weight)."""
    weights = {name: p.detach().numpy() for name, p in model.state_dict().items()}
    writer = GGUFWriter(str(path), "qwen3")
    writer.add_block_count(SHAPE["layers"])
    writer.add_context_length(SHAPE["context"])
    writer.add_embedding_length(SHAPE["hidden"])
    writer.add_feed_forward_length(SHAPE["ffn"])
    writer.add_head_count(SHAPE["heads"])
    writer.add_head_count_kv(SHAPE["kv_heads"])
    writer.add_key_length(SHAPE["head_dim"])
    writer.add_value_length(SHAPE["head_dim"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(1e6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    writer.add_token_merges(MERGES)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(False)
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    for i in range(SHAPE["layers"]):
        for key, hf in LAYER_NAMES.items():
            writer.add_tensor(f"blk.{i}.{key}.weight", weights[f"model.layers.{i}.{hf}.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_qwen3_gguf_runs_as_transformers_runs_its_model(tmp_path):
    hf = random_qwen3()
    write_qwen3_gguf(tmp_path / "qwen3.gguf", hf)
    model_dir = gguf_checkpoint_dir(tmp_path / "qwen3.gguf", tmp_path / "cache")
    config = load_model_config(model_dir)
    assert (config.architecture, config.head_dim, config.qk_norm, config.qkv_bias) == (
        "Qwen3ForCausalLM", 32, True, False)
    assert (config.tie_word_embeddings, config.rope_theta, config.eos_token_ids) == (
        True, 1e6, (1,))
    runner = make_runner(model_dir)
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, len(TOKENS), (10,), generator=gen).tolist()
    blocks = [5, 2, 9, 0, 7]
    logits = [runner.execute(step(seq("a", tokens, 0, blocks)))[0]]
    out = [int(logits[0].argmax())]
    while len(out) < 8:
        logits.append(runner.execute(step(seq("a", [out[-1]], len(tokens) + len(out) - 1,
                                              blocks)))[0])
        out.append(int(logits[-1].argmax()))
    expected = hf_logits(hf, tokens + out)[len(tokens) - 1 : -1]
    assert [int(row.argmax()) for row in expected] == out
    torch.testing.assert_close(torch.stack(logits), expected, atol=1e-4, rtol=0)
