"""Random paged-KV scenarios shared by the kernel tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PagedCase:
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [N, max_blocks] int32
    seq_lens: torch.Tensor  # [N] int32


def make_paged_case(
    seq_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> PagedCase:
    """Random K/V for each sequence in blocks drawn at random (shuffled, non-contiguous)."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks hold garbage that must not be read
    perm = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(blocks_per_seq) + 1  # one padding column
    tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks_per_seq):
        tables[i, :nb] = perm[used : used + nb].to(torch.int32)
        used += nb
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return PagedCase(
        k_cache=k.to(device),
        v_cache=v.to(device),
        block_tables=tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
    )


def dense_kv(case: PagedCase, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence i's K and V as contiguous [seq_len, Hkv, D], token by token."""
    block_size = case.k_cache.shape[1]
    n = int(case.seq_lens[i])
    ks, vs = [], []
    for pos in range(n):
        block_id = int(case.block_tables[i, pos // block_size])
        ks.append(case.k_cache[block_id, pos % block_size])
        vs.append(case.v_cache[block_id, pos % block_size])
    return torch.stack(ks), torch.stack(vs)
