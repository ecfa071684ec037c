"""GGUF tensors read back dequantized, in HF shape and row order: each supported type
against gguf's quantizer (round trip) or against a scalar decoder of its block layout."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from tests.worker.model.gguf import kquant_reference
from tests.worker.model.gguf.tiny_gguf import write_gguf
from worker.model.gguf.reader import dequantized, hf_name, open_gguf, unpermute_rows

ROWS, COLS = 3, 256  # one 256-value super-block per row for the K-quants
# Worst absolute error of a round trip of N(0, 1) values through each type, per block.
ROUND_TRIP = {T.F32: 0.0, T.F16: 1e-3, T.BF16: 2e-2, T.Q8_0: 2e-2, T.Q5_0: 0.15,
              T.Q5_1: 0.1, T.Q4_0: 0.3, T.Q4_1: 0.25}
K_QUANTS = {T.Q4_K: (144, kquant_reference.q4_k), T.Q5_K: (176, kquant_reference.q5_k),
            T.Q6_K: (210, kquant_reference.q6_k)}


def read_back(tmp_path, array, raw_type):
    path = write_gguf(tmp_path / "t.gguf", {"t.weight": (array, raw_type)})
    (tensor,) = open_gguf(path).tensors
    return dequantized(tensor)


@pytest.mark.parametrize("qtype", list(ROUND_TRIP), ids=lambda t: t.name)
def test_round_trip_through_the_file(tmp_path, qtype):
    x = np.random.default_rng(qtype.value).standard_normal((ROWS, COLS)).astype(np.float32)
    if qtype == T.F32:
        got = read_back(tmp_path, x, None)
        assert got.dtype == np.float32 and np.array_equal(got, x)
        return
    packed = quantize(x, qtype)
    got = read_back(tmp_path, packed, None if qtype == T.F16 else qtype)
    assert got.shape == (ROWS, COLS)
    assert np.array_equal(got.astype(np.float32), dequantize(packed, qtype).reshape(ROWS, COLS))
    assert np.abs(got.astype(np.float32) - x).max() <= ROUND_TRIP[qtype]


def _random_k_blocks(qtype, seed):
    size, _ = K_QUANTS[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (ROWS, size), dtype=np.uint8)
    # Exact scales (powers of two), so any order of the float operations gives one answer.
    at = {T.Q6_K: [208], T.Q4_K: [0, 2], T.Q5_K: [0, 2]}[qtype]
    for row in range(ROWS):
        for k, offset in enumerate(at):
            raw[row, offset:offset + 2] = np.frombuffer(
                np.float16(2.0 ** -(row + k + 3)).tobytes(), dtype=np.uint8)
    return raw


@pytest.mark.parametrize("qtype", list(K_QUANTS), ids=lambda t: t.name)
def test_k_quants_equal_a_scalar_decoder_of_the_block_layout(tmp_path, qtype):
    raw = _random_k_blocks(qtype, seed=qtype.value)
    got = read_back(tmp_path, raw, qtype)
    _, decode = K_QUANTS[qtype]
    expected = np.array([decode(bytes(row)) for row in raw], dtype=np.float32)
    assert got.shape == (ROWS, COLS)
    assert np.array_equal(got, expected)


def test_an_unsupported_type_is_refused(tmp_path):
    raw = np.zeros((ROWS, 84), dtype=np.uint8)  # Q2_K: 84 bytes a super-block
    with pytest.raises(ValueError, match="GGUF type Q2_K is not supported"):
        read_back(tmp_path, raw, T.Q2_K)


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Llama's q and k rows (convert_hf_to_gguf.py)."""
    return (weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def test_unpermute_restores_the_hf_row_order():
    # One head of dim 4: HF rows [a0, a1, b0, b1] (the two rotary halves) were written
    # interleaved [a0, b0, a1, b1].
    written = np.array([[10.0], [20.0], [11.0], [21.0]])
    assert unpermute_rows(written, num_heads=1)[:, 0].tolist() == [10.0, 11.0, 20.0, 21.0]
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    assert np.array_equal(unpermute_rows(llama_cpp_permute(w, 8), 8), w)


def test_tensor_names_map_to_the_hf_layout():
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("blk.17.attn_q.weight") == "model.layers.17.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("blk.3.attn_k_norm.weight") == "model.layers.3.self_attn.k_norm.weight"
    assert hf_name("blk.2.attn_v.bias") == "model.layers.2.self_attn.v_proj.bias"
    assert hf_name("rope_freqs.weight") is None
