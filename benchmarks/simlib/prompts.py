"""Segments to token ids, and prompts to their Protocol 1 block hashes (kv.hashing).

A segment key seeds its own generator, so equal keys give equal tokens in any process and
any order, and the first n tokens of a key do not depend on how many are drawn. Shared
segments (system prompts, trace blocks used twice) keep their tokens and the hashes of
their blocks after a given parent, so a prefix used a thousand times is drawn and hashed
once; the hashes are those `kv.hashing.block_hashes` gives the whole prompt.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import xxhash

from benchmarks.simlib.workloads import Segment
from kv.hashing import BlockHash, block_hashes


class TokenSource:
    """Deterministic token ids in [low_token_id, high_token_id) per segment key."""

    def __init__(self, seed: int = 0, low_token_id: int = 3, high_token_id: int = 32000,
                 shared_keys: Iterable[str] = ()):
        if not 0 <= low_token_id < high_token_id <= 2**32:
            raise ValueError(f"token range [{low_token_id}, {high_token_id}) is empty or "
                             "not uint32")
        self.seed = seed
        self.low_token_id = low_token_id
        self.high_token_id = high_token_id
        self.shared_keys = frozenset(shared_keys)
        self._cache: dict[str, np.ndarray] = {}

    def tokens(self, segment: Segment) -> np.ndarray:
        """The segment's token ids, uint32 `[num_tokens]`."""
        cached = self._cache.get(segment.key)
        if cached is not None and len(cached) >= segment.num_tokens:
            return cached[: segment.num_tokens]
        key = xxhash.xxh3_64_intdigest(segment.key.encode())
        rng = np.random.Generator(np.random.PCG64([self.seed, key]))
        out = rng.integers(self.low_token_id, self.high_token_id, segment.num_tokens,
                           dtype=np.uint32)
        if segment.key in self.shared_keys:
            self._cache[segment.key] = out
        return out


class PromptBuilder:
    """Token ids and block hashes of a prompt made of segments, after an optional history.

    Args:
        source: the segments' tokens.
        block_size: tokens per block (the engine's).
        root: the namespace root of the hash chain (kv.hashing.namespace_root).
    """

    def __init__(self, source: TokenSource, block_size: int, root: BlockHash):
        self.source = source
        self.block_size = block_size
        self.root = root
        # (parent hash, segment key, num tokens) -> hashes of the segment's full blocks
        self._memo: dict[tuple[BlockHash, str, int], list[BlockHash]] = {}

    def build(self, segments: Sequence[Segment], history_token_ids: Sequence[int] = (),
              history_hashes: Sequence[BlockHash] = ()) -> tuple[list[int], list[BlockHash]]:
        """Returns (token ids, hashes of every full block). `history_hashes` must hash the
        full blocks of `history_token_ids` (a finished request's `block_hashes`)."""
        B = self.block_size
        if len(history_hashes) != len(history_token_ids) // B:
            raise ValueError(f"{len(history_hashes)} history hashes for "
                             f"{len(history_token_ids)} tokens at block size {B}")
        parts = [self.source.tokens(s) for s in segments]
        if len(history_token_ids):
            parts.insert(0, np.asarray(history_token_ids, dtype=np.uint32))
        all_tokens = np.concatenate(parts) if len(parts) > 1 else parts[0]  # [num_tokens]
        hashes = list(history_hashes)
        num_tokens = len(history_token_ids)
        shared = self.source.shared_keys
        for seg in segments:
            if num_tokens % B or seg.key not in shared:
                break  # unaligned or used once: hash the rest in one go below
            parent = hashes[-1] if hashes else self.root
            memo_key = (parent, seg.key, seg.num_tokens)
            seg_hashes = self._memo.get(memo_key)
            if seg_hashes is None:
                start = num_tokens // B
                seg_hashes = block_hashes(all_tokens[: num_tokens + seg.num_tokens], B,
                                          self.root, start, parent if start else None)
                self._memo[memo_key] = seg_hashes
            hashes.extend(seg_hashes)
            num_tokens += seg.num_tokens
        start = len(hashes)
        if start < len(all_tokens) // B:
            hashes.extend(block_hashes(all_tokens, B, self.root, start,
                                       hashes[-1] if start else None))
        return all_tokens.tolist(), hashes
