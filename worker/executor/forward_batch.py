"""Turn the scheduler's StepInput into the packed tensors of one forward pass.

Request i's chunk covers positions start_pos .. start_pos + n - 1 and is packed at rows
cu_seqlens_q[i] .. cu_seqlens_q[i+1] - 1. Token at position p is written to slot
block_ids[p // block_size] * block_size + p % block_size, except the first skip_kv_write
tokens of the chunk, whose KV is already cached (slot -1: not written).

    positions: 0 ........ start_pos | start_pos ....... start_pos+n-1
               already in the cache | this chunk (skip_kv_write | written)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import kernels
from worker.engine.step import ScheduledSeq, StepInput
from worker.model.attention import AttentionMetadata


@dataclass(frozen=True)
class ForwardBatch:
    token_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] int64, the last row of each chunk with sample=True


def check_seq(seq: ScheduledSeq, block_size: int, num_blocks: int) -> None:
    """Raise ValueError for a chunk the runner cannot compute as described."""
    n = len(seq.token_ids)
    if n < 1 or seq.start_pos < 0 or not 0 <= seq.skip_kv_write <= n:
        raise ValueError(
            f"request {seq.request_id}: bad chunk (tokens {n}, start_pos {seq.start_pos}, "
            f"skip_kv_write {seq.skip_kv_write})"
        )
    needed_blocks = -(-(seq.start_pos + n) // block_size)
    if len(seq.block_ids) < needed_blocks:
        raise ValueError(
            f"request {seq.request_id}: {len(seq.block_ids)} blocks cannot hold "
            f"{seq.start_pos + n} tokens of block size {block_size}"
        )
    if any(not 0 <= b < num_blocks for b in seq.block_ids[:needed_blocks]):
        raise ValueError(f"request {seq.request_id}: block id out of range [0, {num_blocks})")


def check_step(step: StepInput, block_size: int, num_blocks: int, num_host_blocks: int) -> None:
    """Raise ValueError for a step no rank can run; rank 0 calls it before broadcasting, so
    a bad step never leaves the other ranks waiting in a collective."""
    for seq in step.seqs:
        check_seq(seq, block_size, num_blocks)
    for block_id, host_slot in step.copies.swap_out:
        if not (0 <= block_id < num_blocks and 0 <= host_slot < num_host_blocks):
            raise ValueError(f"swap_out ({block_id}, {host_slot}) is out of range")
    for host_slot, block_id in step.copies.swap_in:
        if not (0 <= block_id < num_blocks and 0 <= host_slot < num_host_blocks):
            raise ValueError(f"swap_in ({host_slot}, {block_id}) is out of range")


def build_forward_batch(
    seqs: list[ScheduledSeq], block_size: int, device: torch.device
) -> ForwardBatch:
    """Pack seqs (non-empty, already checked with check_step) for the model's forward."""
    q_lens = np.array([len(s.token_ids) for s in seqs], dtype=np.int64)
    start_pos = np.array([s.start_pos for s in seqs], dtype=np.int64)
    cu = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(q_lens, out=cu[1:])
    num_tokens = int(cu[-1])

    # Block table, 0-padded: the kernels never read past a request's length.
    max_blocks = max(len(s.block_ids) for s in seqs)
    block_tables = np.zeros((len(seqs), max_blocks), dtype=np.int64)
    for i, seq in enumerate(seqs):
        block_tables[i, : len(seq.block_ids)] = seq.block_ids

    # Per token: its request, its offset in the chunk, its position, its slot.
    seq_of_token = np.repeat(np.arange(len(seqs)), q_lens)
    offset = np.arange(num_tokens) - cu[:-1][seq_of_token]
    positions = start_pos[seq_of_token] + offset
    block_ids = block_tables[seq_of_token, positions // block_size]
    slots = block_ids * block_size + positions % block_size
    skip = np.array([s.skip_kv_write for s in seqs], dtype=np.int64)
    slots[offset < skip[seq_of_token]] = -1

    sample_rows = (cu[1:] - 1)[[s.sample for s in seqs]]
    token_ids = np.fromiter(
        (t for s in seqs for t in s.token_ids), dtype=np.int64, count=num_tokens
    )

    def to_device(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(a).to(device=device, dtype=dtype)

    block_tables_t = to_device(block_tables, torch.int32)
    seq_lens_t = to_device(start_pos + q_lens, torch.int32)
    # The cascade decode is the CPU reference's; the Triton decode kernel reads plain tables.
    decode_plan = None
    if device.type == "cpu":
        decode_plan = kernels.plan_single_query_rows(
            torch.from_numpy(q_lens), block_tables_t, seq_lens_t, block_size
        )
    meta = AttentionMetadata(
        slot_mapping=to_device(slots, torch.int64),
        block_tables=block_tables_t,
        seq_lens=seq_lens_t,
        cu_seqlens_q=to_device(cu, torch.int32),
        max_query_len=int(q_lens.max()),
        decode_plan=decode_plan,
    )
    return ForwardBatch(
        token_ids=to_device(token_ids, torch.int64),
        positions=to_device(positions, torch.int64),
        meta=meta,
        sample_rows=to_device(sample_rows, torch.int64),
    )
