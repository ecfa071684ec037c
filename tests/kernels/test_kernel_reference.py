"""The torch reference against a naive token-by-token attention on dense K/V."""

import math

import pytest
import torch

from kernels import reference
from tests.kernels.paged import dense_kv, make_paged_case


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """q [M, Hq, D] are the last M positions of a sequence with k/v [S, Hkv, D]."""
    m, num_heads, _ = q.shape
    s = k.shape[0]
    group = num_heads // k.shape[1]
    out = torch.empty_like(q)
    for row in range(m):
        pos = s - m + row
        for h in range(num_heads):
            scores = (k[: pos + 1, h // group] @ q[row, h]) * scale
            out[row, h] = torch.softmax(scores, 0) @ v[: pos + 1, h // group]
    return out


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_prefill_matches_naive_ragged_with_context(num_heads, num_kv_heads):
    block_size, head_dim = 4, 8
    seq_lens = [1, 4, 5, 11, 8]
    q_lens = [1, 4, 2, 7, 1]  # context lengths 0, 0, 3, 4, 7
    case = make_paged_case(seq_lens, block_size, num_kv_heads, head_dim)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    scale = 1 / math.sqrt(head_dim)
    out = reference.prefill_attention(
        q, case.k_cache, case.v_cache, case.block_tables, cu, case.seq_lens, scale
    )
    for i in range(len(seq_lens)):
        k, v = dense_kv(case, i)
        rows = slice(int(cu[i]), int(cu[i + 1]))
        torch.testing.assert_close(out[rows], naive_attention(q[rows], k, v, scale))


def test_decode_equals_prefill_of_one_token():
    case = make_paged_case([3, 8, 9, 16], block_size=8, num_kv_heads=2, head_dim=16)
    q = torch.randn(4, 4, 16, generator=torch.Generator().manual_seed(2))
    cu = torch.arange(5, dtype=torch.int32)
    args = (case.k_cache, case.v_cache, case.block_tables)
    decode = reference.decode_attention(q, *args, case.seq_lens, 0.25)
    prefill = reference.prefill_attention(q, *args, cu, case.seq_lens, 0.25)
    torch.testing.assert_close(decode, prefill)


def test_write_kv_skips_negative_slots():
    k_cache = torch.zeros(3, 2, 1, 2)
    v_cache = torch.zeros(3, 2, 1, 2)
    key = torch.arange(8.0).reshape(4, 1, 2)
    slots = torch.tensor([5, -1, 0, 3])
    reference.write_kv(key, -key, k_cache, v_cache, slots)
    flat_k = k_cache.view(6, 2)
    assert flat_k.tolist() == [[4, 5], [0, 0], [0, 0], [6, 7], [0, 0], [0, 1]]
    assert torch.equal(v_cache, -k_cache)
