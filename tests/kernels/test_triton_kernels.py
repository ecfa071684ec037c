"""Triton kernels against the torch reference (interpreted on CPU, compiled on a GPU)."""

import math

import pytest
import torch

from kernels import reference
from tests.kernels.paged import make_paged_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cu_seqlens(q_lens: list[int]) -> torch.Tensor:
    return torch.tensor(
        [0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=DEVICE
    )


def test_write_kv_matches_reference():
    from kernels.triton_kv_write import write_kv

    gen = torch.Generator().manual_seed(0)
    key = torch.randn(6, 2, 8, generator=gen).to(DEVICE)
    value = torch.randn(6, 2, 8, generator=gen).to(DEVICE)
    slots = torch.tensor([9, -1, 0, 4, 15, -1], device=DEVICE)
    caches = [torch.full((4, 4, 2, 8), 7.0, device=DEVICE) for _ in range(4)]
    write_kv(key, value, caches[0], caches[1], slots)
    reference.write_kv(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2])
    assert torch.equal(caches[1], caches[3])


# Block size 4: lengths k*4 and k*4 +- 1 around block boundaries; 70 spans several
# 32-token tiles and the padded last block.
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(4, 2, 16), (2, 2, 8), (6, 1, 12)])
def test_decode_matches_reference_ragged_gqa(num_heads, num_kv_heads, head_dim):
    from kernels.triton_decode_attention import decode_attention

    seq_lens = [1, 3, 4, 5, 8, 9, 70]
    case = make_paged_case(seq_lens, 4, num_kv_heads, head_dim, device=DEVICE)
    q = torch.randn(
        len(seq_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(3)
    ).to(DEVICE)
    args = (
        q,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        case.seq_lens,
        1 / math.sqrt(head_dim),
    )
    torch.testing.assert_close(
        decode_attention(*args), reference.decode_attention(*args), atol=1e-5, rtol=1e-5
    )


def test_decode_many_splits_matches_reference():
    """A single long sequence is split across many programs whose results are merged."""
    import kernels.triton_decode_attention as tda

    case = make_paged_case([5, 257], 16, 1, 16, device=DEVICE, seed=4)
    assert tda._tokens_per_split(2, 1, case.block_tables.shape[1] * 16) == 32
    assert tda._tokens_per_split(1, 1, 131072) == 2048  # at most 64 splits
    q = torch.randn(2, 2, 16, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    args = (q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 0.3)
    torch.testing.assert_close(
        tda.decode_attention(*args), reference.decode_attention(*args), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(
    "seq_lens,q_lens",
    [
        # fresh prompts at and around block boundaries (block size 4)
        ([4, 5, 7, 1], [4, 5, 7, 1]),
        # cached context + new tokens; chunks ending at k*4-1, k*4, k*4+1; 40 new tokens
        # cover two 32-row query tiles
        ([11, 12, 13, 45, 9], [3, 4, 5, 40, 1]),
    ],
)
def test_prefill_matches_reference(seq_lens, q_lens):
    from kernels.triton_prefill_attention import prefill_attention

    num_heads, num_kv_heads, head_dim = 4, 2, 16
    case = make_paged_case(seq_lens, 4, num_kv_heads, head_dim, device=DEVICE, seed=6)
    q = torch.randn(
        sum(q_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(7)
    ).to(DEVICE)
    args = (
        q,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        _cu_seqlens(q_lens),
        case.seq_lens,
        0.25,
    )
    expected = reference.prefill_attention(*args)
    torch.testing.assert_close(prefill_attention(*args), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        prefill_attention(*args, max_query_len=max(q_lens)), expected, atol=1e-5, rtol=1e-5
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_on_gpu(dtype):
    from kernels.triton_decode_attention import decode_attention
    from kernels.triton_prefill_attention import prefill_attention

    seq_lens, q_lens = [17, 300, 64], [17, 100, 1]
    case = make_paged_case(seq_lens, 16, 2, 128, dtype=dtype, device=DEVICE, seed=8)
    q = torch.randn(sum(q_lens), 8, 128, device=DEVICE, dtype=dtype)
    args = (
        q,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        _cu_seqlens(q_lens),
        case.seq_lens,
        128**-0.5,
    )
    torch.testing.assert_close(
        prefill_attention(*args), reference.prefill_attention(*args), atol=2e-2, rtol=2e-2
    )
    qd = q[:3].contiguous()
    dargs = (qd, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 128**-0.5)
    torch.testing.assert_close(
        decode_attention(*dargs), reference.decode_attention(*dargs), atol=2e-2, rtol=2e-2
    )
