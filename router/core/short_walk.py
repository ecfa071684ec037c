"""A short prompt's cached prefix on every candidate, walked block by block in Python ints.

The same runs as router.core.prefix_walk (see its docstring: a device run, pending marks
carrying it on, then a host run), found without arrays: for the few blocks of a short prompt,
which the block table looks up one hash at a time anyway (block_table.FEW_HASHES), the array
walk's thirty-odd numpy calls cost more than the whole walk here, and this one stops looking
hashes up once every run has ended (a miss looks up its first block only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kv.hashing import BlockHash
from router.core.pending import PendingMarks
from router.core.prefix_match import PrefixMatch
from router.core.prefix_walk import confirmed_runs, few_matches


def walk_short(block_hashes: Sequence[BlockHash], bits_of: Callable[[BlockHash], int],
               candidates: int, pending: PendingMarks, replica_of_slot: Mapping[int, str]
               ) -> tuple[dict[str, PrefixMatch], dict[str, int]]:
    """`PrefixWalk.runs` after a walk over the whole prompt: (each candidate with a cached
    block -> its match; candidate -> its confirmed device run, for those whose device run a
    pending mark carried on).

    Args:
        bits_of: a hash's mask as one int (bit 2s: slot s's device, 2s + 1: its host).
        candidates: the device bits of the candidate slots.
    """
    pending_bits, pending_by_bit = pending.bits_mask, pending.by_bit
    alive = candidates  # device bits in their device run, host bits in their host run
    device_ends: list[tuple[int, int]] = []  # (block, device bits) where runs end
    ends: list[tuple[int, int]] = []
    confirmed: dict[int, int] = {}  # device bit -> where a mark first carried its run
    for i, block_hash in enumerate(block_hashes):
        m = bits_of(block_hash)
        if alive & m == alive:
            continue
        ending = alive & ~m
        host_ending = ending & ~candidates
        device_ending = ending ^ host_ending
        marked = device_ending & pending_bits
        while marked:  # device runs about to end: marks may carry them on
            bit = marked & -marked
            if block_hash in pending_by_bit[bit]:
                device_ending ^= bit
                confirmed.setdefault(bit, i)
            marked ^= bit
        into_host = (device_ending << 1) & m  # host runs start here
        whole_ending = (device_ending ^ (into_host >> 1)) | (host_ending >> 1)
        if i:  # (a run of no block is no match)
            device_ends.append((i, device_ending))
            ends.append((i, whole_ending))
        alive ^= device_ending | host_ending | into_host
        if not alive:
            break
    else:  # the runs still alive hold the prompt's last block
        n = len(block_hashes)
        device_ends.append((n, alive & candidates))
        ends.append((n, (alive | alive >> 1) & candidates))
    if not ends:  # no run at all: no mark carried one either
        return {}, {}
    return few_matches(device_ends, ends, replica_of_slot), confirmed_runs(confirmed,
                                                                          replica_of_slot)
