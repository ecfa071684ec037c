"""Every candidate's cached prefix of a prompt, walking only the blocks where something changes.

The index gives each replica slot s bit 2s (device) and bit 2s + 1 (host) in a row of
uint64 words per block (router.core.block_table). For a prompt of n blocks, replica s has:

  - a device run of d blocks: the leading blocks on its device, or pending there (a mark
    carries the run on where no event confirms the block yet, router.core.pending);
  - then a host run: the blocks from d on that sit on its host tier.

`alive` holds the device bit of each replica still in its device run and the host bit of
each replica in the host run after it. A run can only end at a block whose bits (the
candidates' only) differ from the block before it, or where a pending mark stops carrying
it, so one array pass finds the blocks that differ (a few per prompt: replicas holding one
prefix end together) and the Python walk visits only those. A device run that a mark
carries on is followed apart, to its end, with one array pass over its column and one
C-speed pass over the marks; the main walk takes it up again where it ends. The walk can
stop after a first part of the prompt and go on over the rest if a run got that far (the
index looks up a prompt's first blocks first: most prompts' cached prefixes end there).
Many runs come out as arrays over the slots (PrefixMatches), not an object per replica; a
few as a dict.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Iterator, Mapping, Sequence
from itertools import compress, repeat
from operator import contains

import numpy as np

from kv.hashing import BlockHash
from router.core.block_table import rows_differ
from router.core.hash_loops import num_leading_in
from router.core.pending import PendingMarks
from router.core.prefix_match import PrefixMatch, PrefixMatches

WORD_BITS = 64
# Runs found in Python up to this many (slot, run) pairs: a few dozen loop steps cost less
# than `_lengths`' dozen numpy calls (at 64 replicas half the prompts have under 8 slots
# with a run, a sixth have all 64)
_RUNS_IN_PYTHON = 16

assert sys.byteorder == "little", "mask words are read as little-endian ints"


def as_int(words: np.ndarray) -> int:
    """A row of uint64 words as one Python int (word k holds bits 64k..64k + 63)."""
    return int.from_bytes(words.tobytes(), "little")


def as_words(bits: int, num_words: int) -> np.ndarray:
    """The inverse of `as_int`: [num_words] uint64."""
    return np.frombuffer(bits.to_bytes(8 * num_words, "little"), np.uint64)


def set_bits(bits: int) -> Iterator[int]:
    """The bits set in `bits`, lowest first, each as an int of its own."""
    while bits:
        low = bits & -bits
        yield low
        bits ^= low


def changed_rows(rows: np.ndarray) -> list[int]:
    """Row 0 and every row that differs from the row before it ([n, W] uint64)."""
    return [0, *map((1).__add__, rows_differ(rows[1:], rows[:-1]).nonzero()[0].tolist())]


def _carried_run_end(masks: np.ndarray, bit: int, start: int, block_hashes: Sequence[BlockHash],
                     pending: Mapping[BlockHash, float]) -> int:
    """Where a device run that a pending mark carries on from row `start` ends: the first
    row at or after `start` neither on the device (`bit`) nor pending (len(masks): none)."""
    word, shift = divmod(bit.bit_length() - 1, WORD_BITS)
    column = masks[start:, word] & np.uint64(1 << shift)
    gaps = ((column == 0).nonzero()[0] + start).tolist()
    k = num_leading_in(pending, map(block_hashes.__getitem__, gaps))
    return gaps[k] if k < len(gaps) else len(masks)


class PrefixWalk:
    """Each candidate's device run and whole cached run of a prompt, walked over a first
    part of its blocks' masks, then on over the rest if some run got to the end of it.

    Args:
        candidates: the device bits (bit 2s) of the candidate slots.
        candidates_are_all: no bit of the masks walked is another replica's.
        block_hashes: the prompt's hashes (pending marks are found by hash).
        pending: the pending marks, by replica device bit.
    """

    def __init__(self, candidates: int, block_hashes: Sequence[BlockHash],
                 pending: PendingMarks, candidates_are_all: bool = False):
        self.candidates = candidates
        self.candidates_are_all = candidates_are_all
        self.block_hashes = block_hashes
        self.pending = pending
        self.alive = candidates  # see the module docstring
        self.walked = 0  # blocks walked
        self.confirmed: dict[int, int] = {}  # device bit -> its confirmed run (carried ones)
        self._last_mask = 0  # the candidates' bits of the last block walked
        self._num_words = 1  # of the masks walked
        # (block, device bits): where device runs end, and where whole runs end
        self._device_ends: list[tuple[int, int]] = []
        self._ends: list[tuple[int, int]] = []
        # heap of (block, device bit): where each device run that marks carry on ends
        # (`walked` for one that reached the end of the blocks walked: it may go on)
        self._carried: list[tuple[int, int]] = []

    @property
    def going(self) -> bool:
        """Some run goes on past the blocks walked."""
        return bool(self.alive or self._carried)

    def walk(self, masks: np.ndarray) -> None:
        """Walks on over masks[walked:] ([n, W] uint64, the masks of the prompt's first n
        blocks, zero for a block no replica holds; the walked part as given before)."""
        start, (n, num_words) = self.walked, masks.shape
        candidates, block_hashes, pending = self.candidates, self.block_hashes, self.pending
        carried = self._carried
        for i, (end, bit) in enumerate(carried):  # the runs that reached the last part's end
            if end == start:
                carried[i] = (_carried_run_end(masks, bit, start, block_hashes,
                                               pending.by_bit[bit]), bit)
        heapq.heapify(carried)
        # The candidates' bits only: another replica's bits change no run, but each block
        # where they change is one more to visit. When the candidates are every replica the
        # index has (a router's mostly are), the masks are read as they are: two calls less.
        masked = (masks[start:] if self.candidates_are_all else
                  masks[start:] & as_words(candidates | candidates << 1, num_words))
        at = changed_rows(masked)
        width = 8 * num_words
        row_bytes = masked[at].tobytes()
        row_ints = [int.from_bytes(row_bytes[k:k + width], "little")
                    for k in range(0, len(row_bytes), width)]
        pending_bits, pending_by_bit = pending.bits_mask, pending.by_bit
        alive, m = self.alive, self._last_mask
        device_ends, ends = self._device_ends, self._ends

        def run_ends(i: int, device_ending: int, m: int) -> int:
            """Device runs end at block i; returns the host bits whose host run starts
            there."""
            into_host = (device_ending << 1) & m
            if i and device_ending:
                device_ends.append((i, device_ending))
                if device_ending ^ (into_host >> 1):
                    ends.append((i, device_ending ^ (into_host >> 1)))
            return into_host

        def take_up(last: int, m: int) -> int:
            """Carried runs ending at blocks <= last (of mask m) end; returns the host bits
            whose host run starts there."""
            into_host = 0
            while carried and carried[0][0] <= last:
                end, bit = heapq.heappop(carried)
                into_host |= run_ends(end, bit, m)
            return into_host

        for i, m_next in zip((start + k for k in at), row_ints):
            if carried:  # blocks between changes repeat the last changed one
                alive |= take_up(i - 1, m) | take_up(i, m_next)
            m = m_next
            if alive & m == alive:
                if not alive and not carried:
                    break
                continue
            ending = alive & ~m
            host_ending = ending & ~candidates
            device_ending = ending ^ host_ending
            if device_ending & pending_bits:  # device runs about to end: marks may carry them
                block_hash = block_hashes[i]
                for bit in _marked(device_ending & pending_bits, pending, block_hash):
                    end = _carried_run_end(masks, bit, i, block_hashes, pending_by_bit[bit])
                    heapq.heappush(carried, (end, bit))
                    self.confirmed[bit] = i
                    device_ending ^= bit
            if host_ending:
                ends.append((i, host_ending >> 1))
            alive ^= ending | run_ends(i, device_ending, m)
        self.alive = alive | take_up(n - 1, m)
        self._last_mask, self.walked, self._num_words = m, n, num_words

    def runs(self, replica_of_slot: Mapping[int, str]
             ) -> tuple[Mapping[str, PrefixMatch], dict[str, int]]:
        """(each candidate with a cached block -> its match; candidate -> its confirmed
        device run, for those whose device run a pending mark carried on), over the blocks
        walked. Many runs come as arrays (PrefixMatches), so that a prefix most of a large
        fleet shares costs no Python work per replica; a few as a dict."""
        n, alive, candidates = self.walked, self.alive, self.candidates
        device_ends, ends = list(self._device_ends), list(self._ends)
        whole = (alive & candidates) | sum(bit for _, bit in self._carried)  # device runs
        if whole:  # to the end
            device_ends.append((n, whole))
        if whole | (alive >> 1 & candidates):  # and whole runs
            ends.append((n, whole | (alive >> 1 & candidates)))
        confirmed = confirmed_runs(self.confirmed, replica_of_slot)
        if sum(bits.bit_count() for _, bits in ends) <= _RUNS_IN_PYTHON:
            return few_matches(device_ends, ends, replica_of_slot), confirmed
        total = _lengths(ends, self._num_words)
        slots = total.nonzero()[0]
        return PrefixMatches(list(map(replica_of_slot.__getitem__, slots.tolist())),
                             _lengths(device_ends, self._num_words)[slots], total[slots]
                             ), confirmed


def few_matches(device_ends: list[tuple[int, int]], ends: list[tuple[int, int]],
                replica_of_slot: Mapping[int, str]) -> dict[str, PrefixMatch]:
    """The matches of a few runs, by replica in slot order: `device_ends` and `ends` list
    (block, device bits) where device runs and whole runs end (runs of no block unlisted)."""
    total_at, device_at = _ends_by_slot(ends), _ends_by_slot(device_ends)
    matches = {}
    for slot in sorted(total_at):
        device = device_at.get(slot, 0)
        matches[replica_of_slot[slot]] = PrefixMatch(device, total_at[slot] - device)
    return matches


def confirmed_runs(confirmed: dict[int, int], replica_of_slot: Mapping[int, str]
                   ) -> dict[str, int]:
    """Device bit -> confirmed device run, by replica."""
    return {replica_of_slot[(bit.bit_length() - 1) >> 1]: i for bit, i in confirmed.items()}


def _ends_by_slot(ends: list[tuple[int, int]]) -> dict[int, int]:
    """`_lengths` for a few slots: slot -> the block at which its run ends (runs only)."""
    at = {}
    for i, bits in ends:
        while bits:
            low = bits & -bits
            at[low.bit_length() >> 1] = i  # device bit 2s: bit_length 2s + 1
            bits ^= low
    return at


def _lengths(ends: list[tuple[int, int]], num_words: int) -> np.ndarray:
    """Per slot, the block at which its run ends ([32 W] int64): `ends` lists (block,
    device bits), each bit in one entry at most (0: no run)."""
    if not ends:
        return np.zeros(num_words * WORD_BITS // 2, np.int64)
    width = 8 * num_words
    rows = np.frombuffer(b"".join(bits.to_bytes(width, "little") for _, bits in ends),
                         np.uint8).reshape(len(ends), width)
    bits = np.unpackbits(rows, axis=1, bitorder="little")[:, 0::2]  # device bit 2s: slot s
    return np.fromiter((i for i, _ in ends), np.int64, len(ends)) @ bits


def _marked(bits: int, pending: PendingMarks, block_hash: BlockHash) -> list[int]:
    """The device bits among `bits` (each with marks) whose replica has `block_hash`
    pending. When they are at least half the replicas with marks (a prompt's first block,
    where most runs end), every replica with marks is asked in one C-speed pass; else only
    theirs, one by one (a probe of a replica's marks costs about half a step of the loop)."""
    if 2 * bits.bit_count() >= len(pending.by_bit):
        marked_bits, marks = pending.listed()
        return [bit for bit in compress(marked_bits, map(contains, marks, repeat(block_hash)))
                if bit & bits]
    by_bit = pending.by_bit
    return [bit for bit in set_bits(bits) if block_hash in by_bit[bit]]
