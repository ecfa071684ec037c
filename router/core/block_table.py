"""Interned block hashes in flat numpy arrays: 16-byte hash -> row, and each row's bitmask.

The router's index holds millions of distinct hashes, each on a few of up to hundreds of
replicas. As Python objects (a bytes key, a dict entry, an int bitmask of 2 bits per replica
and a per-replica set entry per holding) that is about 81 B per holding at 256 replicas.
Here a hash is a row of fixed-width arrays instead:

    keys    [rows, 2] uint64   the hash's 16 bytes (native order, as np.frombuffer reads them)
    masks   [rows, W] uint64   2 bits per replica slot, bit 2s device, 2s + 1 host
    _next   [rows]    int32    next row in the same bucket's chain (row 0 ends it)
    _used   [rows]    bool     the row holds a hash (else it is free, or row 0)
    _stamps [rows]    int32    scratch: drops repeated rows without a sort
    _heads  [buckets] int32    first row of each bucket's chain (row 0: empty)

Lookups, inserts and deletes take whole arrays of hashes (one event's, one prompt's), so the
interpreter runs per call, not per hash; a few hashes go one by one (FEW_HASHES). Chained
buckets rather than open addressing: a delete relinks its chain exactly, so no tombstones
pile up and force a rehash under churn. Linking a batch into chains runs in rounds: every
row writes itself as its bucket's head, one writer per bucket wins and keeps the old head as
its next, the others retry; the rounds are the most rows of the batch sharing a bucket.

Row 0 is never a hash's row and its mask stays zero: it ends every chain, and `lookup`
answers absent hashes with it, so neither a probe nor a gather of masks needs a branch (a
probe that reaches row 0 stops there whether or not its all-zero key compares equal). A
lookup walks all chains in lock step, one gather per step, for as many steps as the longest
chain it meets (load factor at most 1/2: about 4 steps for a 512-hash prompt), the last few
hashes one by one. Freed rows are reused before the arrays grow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

HASH_BYTES = 16
SLOTS_PER_WORD = 32  # two bits (device, host) per replica slot in a 64-bit word
_MIN_BUCKET_BITS = 10
_MIX1 = np.uint64(0x9E3779B97F4A7C15)
_MIX2 = np.uint64(0xBF58476D1CE4E5B9)
_MIX1_INT, _MIX2_INT = int(_MIX1), int(_MIX2)
_MASK64 = (1 << 64) - 1
_SHIFTS = [np.uint64(64 - bits) for bits in range(65)]  # by bucket bits
_BOOL_ROWS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # W bools as one int
# A lookup's chain walk finishes in Python once this few hashes walk on: a vectorised step
# costs ~9 numpy calls whatever their number, a hash's step in Python well under one
# (64 x 1M, 512-hash prompts: ~200 walk one step, ~40 two, ~5 three; -3% of a match)
_WALK_IN_PYTHON = 8
# Hashes looked up (or interned, deleted) one by one in Python ints up to this many: 3-9 us
# a hash that way, against an array pass's fixed ~50-400 us (30-60 numpy calls; an event
# run of 16 hashes applied in 295 us against 420, of 32 in 537 against 498)
FEW_HASHES = 16


def _unique_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct keys, where each key is among them). Sorts on the second word alone
    (a uint64 sort: ~20x a sort of 16-byte records), and falls back to np.unique on whole
    keys only when two keys share that word. Keys whose second words all differ (nearly
    every batch: a run seldom stores a new hash twice) are returned as they are, after a
    plain sort of those words (a third of an argsort's time, and no gathers)."""
    second = np.sort(keys[:, 1])
    if (second[1:] != second[:-1]).all():
        return keys, np.arange(len(keys))
    order = np.argsort(keys[:, 1])
    ordered = keys[order]
    same_word = ordered[1:, 1] == ordered[:-1, 1]
    if (same_word & (ordered[1:, 0] != ordered[:-1, 0])).any():
        distinct, inverse = np.unique(keys.view(f"V{HASH_BYTES}").ravel(), return_inverse=True)
        return distinct.view(np.uint64).reshape(-1, 2), inverse.ravel()
    starts = np.concatenate(([True], ~same_word))
    inverse = np.empty(len(keys), np.intp)
    inverse[order] = np.cumsum(starts) - 1
    return ordered[starts], inverse


def rows_nonzero(words: np.ndarray) -> np.ndarray:
    """Per row of [n, W] uint64 words, True when any word is nonzero. numpy's any(axis=1)
    over a handful of words runs an inner loop per row (10x slower at W = 8); W bools are
    read as one integer instead."""
    nonzero = words != 0
    as_one = _BOOL_ROWS.get(words.shape[1])
    return nonzero.view(as_one).ravel() != 0 if as_one else nonzero.any(axis=1)


def rows_differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row of two [n, W] uint64 arrays, nonzero where they differ (as `rows_nonzero`
    of a ^ b, one call fewer: the W bools read as one integer are not compared to zero)."""
    differs = a != b
    as_one = _BOOL_ROWS.get(a.shape[1])
    return differs.view(as_one).ravel() if as_one else differs.any(axis=1)


def check_lengths(block_hashes: Iterable[bytes]) -> None:
    if any(len(block_hash) != HASH_BYTES for block_hash in block_hashes):
        raise ValueError(f"block hashes must be {HASH_BYTES} bytes each")


def _key_ints(block_hash: bytes) -> tuple[int, int]:  # as key_words reads them
    return int.from_bytes(block_hash[:8], "little"), int.from_bytes(block_hash[8:], "little")


def key_words(block_hashes: Iterable[bytes]) -> np.ndarray:
    """The hashes as a read-only [n, 2] uint64 array (one join, no per-hash work)."""
    hashes = block_hashes if isinstance(block_hashes, (list, tuple)) else list(block_hashes)
    joined = b"".join(hashes)
    if len(joined) != HASH_BYTES * len(hashes):
        raise ValueError(f"block hashes must be {HASH_BYTES} bytes each")
    return np.frombuffer(joined, dtype=np.uint64).reshape(-1, 2)


class BlockTable:
    """Hash -> row, plus one bitmask row per hash (see the module docstring)."""

    def __init__(self, num_words: int = 1, initial_rows: int = 1024):
        if num_words < 1 or initial_rows < 2:
            raise ValueError(f"BlockTable: num_words >= 1 and initial_rows >= 2, got "
                             f"{num_words}, {initial_rows}")
        self.keys = np.zeros((initial_rows, 2), np.uint64)
        self._k0, self._k1 = self.keys[:, 0], self.keys[:, 1]  # views: a probe compares k1
        self.masks = np.zeros((initial_rows, num_words), np.uint64)
        self._next = np.zeros(initial_rows, np.int32)
        self._used = np.zeros(initial_rows, bool)  # rows holding a hash
        self._stamps = np.zeros(initial_rows, np.int32)  # scratch of unique_rows
        self._num_rows = 1  # rows ever handed out, row 0 included
        self._free = np.zeros(0, np.int32)  # freed rows, reused last freed first
        self._num_free = 0
        self._bucket_bits = _MIN_BUCKET_BITS
        self._heads = np.zeros(1 << self._bucket_bits, np.int32)
        self.num_live = 0  # rows holding a hash

    @property
    def num_words(self) -> int:
        return self.masks.shape[1]

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.keys, self.masks, self._next, self._used, self._stamps,
                                       self._free, self._heads))

    def widen(self, num_words: int) -> None:
        """Makes room for `SLOTS_PER_WORD * num_words` replica slots."""
        if num_words > self.num_words:  # doubled: a fleet coming up copies log(W) times
            num_words = max(num_words, 2 * self.num_words)
            masks = np.zeros((len(self.masks), num_words), np.uint64)
            masks[:, :self.num_words] = self.masks
            self.masks = masks

    # -- lookups ---------------------------------------------------------------------------

    def _buckets(self, keys: np.ndarray) -> np.ndarray:
        """Each key's bucket, as intp: the shifted words are below 2^54, so the uint64
        array is read as int64 in place (indexing with uint64 casts on every use: a
        scatter 3x slower)."""
        x = keys[:, 1] * _MIX1
        x ^= keys[:, 0]
        x *= _MIX2
        x >>= _SHIFTS[self._bucket_bits]
        return x.view(np.int64)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The row of each hash ([n, 2] uint64 words), 0 where absent. Returns [n] intp.

        The probe compares the second word only (xxh3 output: as good as the whole key to
        tell rows apart, and half the gathers); the first word is checked once at the end,
        and the rare hash stopped by a row that shares only its second word is looked up
        again one by one."""
        if not len(keys):
            return np.zeros(0, np.intp)
        want = keys[:, 1]
        k1, nxt = self._k1, self._next
        rows = self._heads[self._buckets(keys)].astype(np.intp)
        # Most hashes are settled by their chain's head (found, or an empty bucket): only
        # the others walk on, each step over the ones still walking. (`.nonzero()[0]`, not
        # np.flatnonzero: a method call costs a third of numpy's Python-level functions.)
        at = ((k1[rows] != want) & (rows != 0)).nonzero()[0]
        probe, want_at = rows[at], want[at]
        while at.size > _WALK_IN_PYTHON:  # each walking hash steps on
            probe = nxt[probe]
            rows[at] = probe
            going = (k1[probe] != want_at) & (probe != 0)
            at, probe, want_at = at[going], probe[going], want_at[going]
        if at.size:  # the last few walk on one by one (a step costs 9 numpy calls)
            k1_of, next_of = memoryview(k1), memoryview(nxt)
            for i, row, word in zip(at.tolist(), probe.tolist(), want_at.tolist()):
                row = next_of[row]
                while row and k1_of[row] != word:
                    row = next_of[row]
                rows[i] = row
        wrong = ((self._k0[rows] != keys[:, 0]) & (rows != 0)).nonzero()[0]
        for i in wrong.tolist():
            rows[i] = self.lookup_one(keys[i].tobytes()) or 0
        return rows

    def lookup_hashes(self, block_hashes: Sequence[bytes]) -> np.ndarray:
        """`lookup` of hashes as bytes: a few (a short prompt's) one by one in Python ints,
        which costs less than the arrays' ~30 numpy calls."""
        if len(block_hashes) > FEW_HASHES:
            return self.lookup(key_words(block_hashes))
        check_lengths(block_hashes)
        rows = np.zeros(len(block_hashes), np.intp)
        for i, block_hash in enumerate(block_hashes):
            rows[i] = self._find_one(*_key_ints(block_hash))
        return rows

    def lookup_one(self, block_hash: bytes) -> int | None:
        """One hash's row without numpy's per-call overhead (None: absent)."""
        if len(block_hash) != HASH_BYTES:
            return None
        return self._find_one(*_key_ints(block_hash)) or None

    def _bucket_one(self, k0: int, k1: int) -> int:
        """`_buckets` of one key, in Python ints."""
        x = ((k0 ^ ((k1 * _MIX1_INT) & _MASK64)) * _MIX2_INT) & _MASK64
        return x >> (64 - self._bucket_bits)

    def _find_one(self, k0: int, k1: int) -> int:
        """The key's row, 0 when absent."""
        # (`.item`: a Python int at a third of the cost of an indexed numpy scalar's int())
        key_of, next_of = self.keys.item, self._next.item
        row = self._heads.item(self._bucket_one(k0, k1))
        while row:
            if key_of(row, 1) == k1 and key_of(row, 0) == k0:
                return row
            row = next_of(row)
        return 0

    def masks_of(self, rows: np.ndarray) -> np.ndarray:
        """The masks of rows ([n] ints) as a new [n, W] array. take, not masks[rows]:
        numpy's fancy indexing copies a row of W words through a generic inner loop per
        row, 3-4x the time of take's row copy (87 vs 24 ns a row at W = 8, 4M rows); the
        method, not np.take, which adds ~2 us of Python-level dispatch a call."""
        return self.masks.take(rows, axis=0)

    def hashes(self, rows: np.ndarray) -> list[bytes]:
        """The hashes of rows, as bytes."""
        return self.keys[rows].view(f"V{HASH_BYTES}").ravel().tolist()

    # -- inserts and deletes ---------------------------------------------------------------

    def intern(self, keys: np.ndarray) -> np.ndarray:
        """The row of each hash, inserting the absent ones (a zero mask). Returns [n] intp."""
        rows = self.lookup(keys)
        absent = np.flatnonzero(rows == 0)
        if absent.size:
            new_keys, inverse = _unique_keys(keys[absent])
            rows[absent] = self._insert(new_keys)[inverse]
        return rows

    def intern_one(self, block_hash: bytes) -> int:
        """`intern` of one hash in Python ints (see FEW_HASHES)."""
        check_lengths((block_hash,))
        k0, k1 = _key_ints(block_hash)
        row = self._find_one(k0, k1)
        if row:
            return row
        if 2 * (self.num_live + 1) > len(self._heads):  # load factor at most 1/2
            self._rehash(self._bucket_bits + 1)
        bucket = self._bucket_one(k0, k1)  # (after any rehash)
        if self._num_free:
            self._num_free -= 1
            row = self._free.item(self._num_free)
        else:
            row = self._num_rows
            self._num_rows += 1
            if self._num_rows > len(self.keys):  # by an eighth, as `_alloc`
                self._grow(max(self._num_rows, len(self.keys) + len(self.keys) // 8))
        self._k0[row] = k0  # (one word at a time: a tuple assigned to the row costs 5x)
        self._k1[row] = k1
        self._used[row] = True
        self._next[row] = self._heads.item(bucket)
        self._heads[bucket] = row
        self.num_live += 1
        return row

    def unique_rows(self, rows: np.ndarray) -> np.ndarray:
        """Rows without repeats, one occurrence each in input order (no sort: every
        occurrence stamps its position on its row, and the one whose stamp stayed wins)."""
        order = np.arange(len(rows), dtype=np.int32)
        self._stamps[rows] = order
        return rows[self._stamps[rows] == order]

    def _insert(self, keys: np.ndarray) -> np.ndarray:
        n = len(keys)
        if 2 * (self.num_live + n) > len(self._heads):  # load factor at most 1/2
            bits = self._bucket_bits
            while 2 * (self.num_live + n) > 1 << bits:
                bits += 1
            self._rehash(bits)
        rows = self._alloc(n)
        self.keys[rows] = keys
        self._used[rows] = True
        self._link(rows, self._buckets(keys))
        self.num_live += n
        return rows

    def free(self, rows: np.ndarray) -> None:
        """Deletes rows whose masks are zero: their hashes are gone, the rows reusable."""
        if not rows.size:
            return
        self._used[rows] = False
        buckets = np.unique(self._buckets(self.keys[rows]))
        frontier = self._heads[buckets]
        self._heads[buckets] = 0
        chained = []
        while frontier.size:
            frontier = frontier[frontier != 0]
            chained.append(frontier)
            frontier = self._next[frontier]
        kept = np.concatenate(chained).astype(np.intp)
        kept = kept[self._used[kept]]
        self._link(kept, self._buckets(self.keys[kept]))
        self.num_live -= len(rows)
        self._push_free(rows, len(rows))

    def _push_free(self, rows: np.ndarray | int, n: int) -> None:  # n rows, or one int
        if self._num_free + n > len(self._free):
            grown = np.zeros(max(2 * len(self._free), self._num_free + n), np.int32)
            grown[:self._num_free] = self._free[:self._num_free]
            self._free = grown
        self._free[self._num_free:self._num_free + n] = rows
        self._num_free += n

    def free_one(self, row: int) -> None:
        """`free` of one live row whose mask is zero, in Python ints: unlinked from its
        chain. Raises ValueError (and changes nothing) for a row that is not live."""
        bucket = self._bucket_one(self.keys.item(row, 0), self.keys.item(row, 1))
        nxt, next_of = self._next, self._next.item
        at = self._heads.item(bucket)
        while at and at != row and next_of(at) != row:  # row 0 ends every chain
            at = next_of(at)
        if not at or not self._used.item(row):
            raise ValueError(f"BlockTable.free_one: row {row} is not a live row")
        if at == row:
            self._heads[bucket] = next_of(row)
        else:
            nxt[at] = next_of(row)
        self._used[row] = False
        self.num_live -= 1
        self._push_free(row, 1)

    def _alloc(self, n: int) -> np.ndarray:
        reused = min(n, self._num_free)
        self._num_free -= reused
        rows = self._free[self._num_free:self._num_free + reused].astype(np.intp)
        fresh = n - reused
        if fresh:
            start = self._num_rows
            self._num_rows += fresh
            if self._num_rows > len(self.keys):
                # by an eighth: a realloc remaps a large block rather than copying it, so
                # growing often costs little, and the slack a table carries is an eighth
                # of its rows at most (a half cost 3.3 B a holding at 256 x 4M)
                self._grow(max(self._num_rows, len(self.keys) + len(self.keys) // 8))
            rows = np.concatenate([rows, np.arange(start, start + fresh)])
        return rows

    def _grow(self, num_rows: int) -> None:
        """Enlarges the row arrays in place (realloc: a large block is remapped, not copied,
        so growing a million rows is no stall); the new rows are zero. Nothing outside this
        object keeps a view of them, and `_k0` and `_k1`, the views, are taken again."""
        for name in ("keys", "masks", "_next", "_used", "_stamps"):
            getattr(self, name).resize((num_rows, *getattr(self, name).shape[1:]),
                                       refcheck=False)
        self._k0, self._k1 = self.keys[:, 0], self.keys[:, 1]

    def _rehash(self, bucket_bits: int) -> None:
        self._bucket_bits = bucket_bits
        self._heads = np.zeros(1 << bucket_bits, np.int32)
        rows = np.flatnonzero(self._used[:self._num_rows])
        self._link(rows, self._buckets(self.keys[rows]))

    def _link(self, rows: np.ndarray, buckets: np.ndarray) -> None:
        """Puts rows at the head of their buckets' chains (see the module docstring)."""
        heads, nxt = self._heads, self._next
        while rows.size:
            old = heads[buckets]
            heads[buckets] = rows
            won = heads[buckets] == rows
            nxt[rows[won]] = old[won]
            lost = ~won
            rows, buckets = rows[lost], buckets[lost]

    def check_invariants(self) -> None:
        assert not self.masks[0].any() and not self._used[0], "row 0 is not the empty row"
        used = np.flatnonzero(self._used[:self._num_rows])
        assert len(used) == self.num_live, "live row count drifted"
        assert not self._used[self._num_rows:].any(), "a row past the high-water mark"
        free = self._free[:self._num_free]
        assert len(np.unique(free)) == len(free), "a row freed twice"
        assert not self._used[free].any(), "a live row on the free list"
        assert len(free) + len(used) == self._num_rows - 1, "a row neither live nor free"
        assert self.masks[used].any(axis=1).all(), "an empty index entry"
        assert not self.masks[free].any(), "a freed row kept bits"
        assert (self.lookup(self.keys[used]) == used).all(), "a live row is not found"
        chained = 0
        for head in np.flatnonzero(self._heads):
            row = int(self._heads[head])
            while row:
                chained += 1
                row = int(self._next[row])
        assert chained == len(used), "chains hold rows that are not live, or miss some"
