"""One replica's blocks on one medium, as rows of the index's BlockTable.

The table's masks say who holds each row; a replica also needs its own list so that a
clear, a snapshot or its removal costs what it held, not the whole table. The list is an
int32 array appended to on every add and never edited on a remove: it may hold stale rows
(removed since, or freed and reused for another hash) and duplicates (removed, then added
again). The rows it holds are exactly the listed rows whose mask carries its bit, and
every row carrying its bit is listed (an add appends the rows whose bit it sets). The list
is compacted (stale rows dropped, duplicates merged) once it is twice what is held: 4 B per
holding, 8 B at worst, instead of a dict entry and a hash object.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import numpy as np

from router.core.block_table import BlockTable

_MIN_COMPACT_ROWS = 64


class HeldRows:
    """The listed rows of one (replica slot, medium): word and bit of that pair in masks."""

    __slots__ = ("word", "bit", "count", "_rows", "_len")

    def __init__(self, bit_index: int):
        self.word = bit_index >> 6
        self.bit = np.uint64(1 << (bit_index & 63))
        self.count = 0  # rows held, each once
        self._rows = np.zeros(16, np.int32)
        self._len = 0

    def nbytes(self) -> int:
        return self._rows.nbytes

    def append(self, rows: np.ndarray) -> None:
        """Lists rows whose bit was just set (each once)."""
        end = self._len + len(rows)
        if end > len(self._rows):
            grown = np.zeros(max(end, len(self._rows) * 3 // 2), np.int32)
            grown[:self._len] = self._rows[:self._len]
            self._rows = grown
        self._rows[self._len:end] = rows
        self._len = end
        self.count += len(rows)

    def held(self, table: BlockTable) -> np.ndarray:
        """The rows held, each once, in no particular order (leaves the list as it is)."""
        rows = self._rows[:self._len]
        rows = rows[(table.masks[rows, self.word] & self.bit) != 0]
        return rows if len(rows) == self.count else table.unique_rows(rows)

    def compact(self, table: BlockTable) -> None:
        """Drops stale and duplicate rows once they are as many as the rows held."""
        if self._len > max(_MIN_COMPACT_ROWS, 2 * self.count):
            rows = self.held(table)
            self._rows = rows.astype(np.int32)
            self._len = len(rows)

    def clear(self) -> None:
        self._rows = np.zeros(16, np.int32)
        self._len = self.count = 0


class HeldView(Collection):
    """A replica's blocks on one medium, read-only and live: valid under the lock that
    guards the index, until the index changes."""

    def __init__(self, table: BlockTable, rows: HeldRows):
        self._table = table
        self._rows = rows

    def __len__(self) -> int:
        return self._rows.count

    def __contains__(self, block_hash: object) -> bool:
        if not isinstance(block_hash, bytes):
            return False
        row = self._table.lookup_one(block_hash)
        rows = self._rows
        return row is not None and bool(self._table.masks[row, rows.word] & rows.bit)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._table.hashes(self._rows.held(self._table)))

    def key_words(self) -> np.ndarray:
        """The hashes as [n, 2] uint64 words, without making a bytes object per hash."""
        return self._table.keys[self._rows.held(self._table)]
