"""Many replicas' runs of adds (or removes) applied to the BlockTable in one pass.

A mirror's poll brings the batches of many replicas at once. Applied one replica at a time,
each run of events costs some 30 numpy calls whatever its size: at the simulator's shapes
(about 60 blocks a batch) that was 160 us a batch, 0.4M blocks a second. Here the runs of
every (replica slot, medium) pair of one round are joined into one column of hashes, with
each hash's pair beside it, and go through one lookup, one dedup and one scatter:

    hashes   [h0 h1 h2 | h3 h4 | h5 ...]      every pair's run, one after the other
    pair     [ 0  0  0 |  1  1 |  2 ...]      -> that pair's mask word and bit

Two pairs may set bits in the same mask word of the same row (two replicas store one
hash), so the scatter is an unbuffered `ufunc.at`. Rows and bits of one pair are its own:
runs of different pairs commute, which is what lets a round take one run of every pair.

Each pass returns, per medium, the change in rows some replica holds on it (the index's
counts): what the touched rows count after, minus before.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from kv.hashing import BlockHash
from router.core.block_table import HASH_BYTES, BlockTable, rows_nonzero
from router.core.held_rows import HeldRows

_DEVICE_WORD = np.uint64(0x5555_5555_5555_5555)  # the device bits of a mask word
_HOST_WORD = _DEVICE_WORD << np.uint64(1)
_ROW_BITS = 32  # a (pair, row) pair sorts as one int64: pair << 32 | row


def _column(table: BlockTable, runs: Sequence[tuple[HeldRows, Sequence[BlockHash]]]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(keys [n, 2], pair of each hash [n], word of each pair [P], bit of each pair [P])."""
    counts = [len(hashes) for _, hashes in runs]
    joined = b"".join(chain.from_iterable(hashes for _, hashes in runs))  # no per-hash list
    if len(joined) != HASH_BYTES * sum(counts):
        raise ValueError(f"block hashes must be {HASH_BYTES} bytes each")
    keys = np.frombuffer(joined, np.uint64).reshape(-1, 2)
    pair = np.repeat(np.arange(len(runs)), counts)
    words = np.array([held.word for held, _ in runs], np.intp)
    bits = np.array([held.bit for held, _ in runs], np.uint64)
    return keys, pair, words, bits


def count_rows(masks: np.ndarray) -> tuple[int, int]:
    """(rows of `masks` [n, W] some replica holds on the device, on the host). A row's
    words ORed together keep device bits even and host bits odd: one word a row."""
    folded = masks[:, 0].copy()
    for word in range(1, masks.shape[1]):
        folded |= masks[:, word]
    return int(np.count_nonzero(folded & _DEVICE_WORD)), int(np.count_nonzero(folded & _HOST_WORD))


def _distinct(pair: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pair, row) once each, sorted by pair (a sort of one int64 key: np.unique's hash
    table cost 5x as much)."""
    both = np.sort(pair.astype(np.int64) << _ROW_BITS | rows)
    both = both[np.concatenate(([True], both[1:] != both[:-1]))]
    return both >> _ROW_BITS, both & ((1 << _ROW_BITS) - 1)


def _scatter(table: BlockTable, pair: np.ndarray, rows: np.ndarray, words: np.ndarray,
             bits: np.ndarray, ufunc: np.ufunc
             ) -> tuple[np.ndarray, np.ndarray, list[int], np.ndarray, np.ndarray]:
    """Applies `ufunc(mask word, bit)` to each (pair, row), every one of which changes its
    bit. Returns (the touched rows once each, their masks after, per medium the change in
    rows holding it, then `pair` and `rows` once each, still in pair order)."""
    touched = table.unique_rows(rows)
    before = table.masks_of(touched)
    ufunc.at(table.masks.reshape(-1), rows * table.num_words + words[pair], bits[pair])
    after = table.masks_of(touched)
    if int(np.bitwise_count(after ^ before).sum()) != len(rows):  # some pair named a row twice
        pair, rows = _distinct(pair, rows)
    change = [a - b for a, b in zip(count_rows(after), count_rows(before))]
    return touched, after, change, pair, rows


def add_runs(table: BlockTable, runs: Sequence[tuple[HeldRows, Sequence[BlockHash]]]) -> list[int]:
    """Sets each pair's bit on its hashes' rows (interning new hashes) and lists the rows
    newly held. Returns per medium (device, host) the change in rows holding it."""
    keys, pair, words, bits = _column(table, runs)
    rows = table.intern(keys)
    new = (table.masks[rows, words[pair]] & bits[pair]) == 0
    _, _, change, pair, rows = _scatter(table, pair[new], rows[new], words, bits,
                                        np.bitwise_or)
    bounds = np.searchsorted(pair, np.arange(len(runs) + 1))
    for k, (held, _) in enumerate(runs):
        if bounds[k + 1] > bounds[k]:
            held.append(rows[bounds[k]:bounds[k + 1]])
    return change


def remove_runs(table: BlockTable, runs: Sequence[tuple[HeldRows, Sequence[BlockHash]]]
                ) -> list[int]:
    """Clears each pair's bit on its hashes' rows (absent ones and rows it does not hold
    are skipped) and frees rows left empty. Returns per medium the change in rows."""
    keys, pair, words, bits = _column(table, runs)
    rows = table.lookup(keys)  # 0 where absent: row 0's mask is zero, so never held
    held_now = (table.masks[rows, words[pair]] & bits[pair]) != 0
    touched, after, change, pair, _ = _scatter(table, pair[held_now], rows[held_now], words,
                                               ~bits, np.bitwise_and)
    table.free(touched[~rows_nonzero(after)])
    for k, num_rows in enumerate(np.bincount(pair, minlength=len(runs)).tolist()):
        if num_rows:
            held = runs[k][0]
            held.count -= num_rows
            held.compact(table)
    return change
