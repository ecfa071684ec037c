"""What a prefix walk returns: per replica, its cached prefix of the prompt."""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping
from itertools import repeat
from typing import NamedTuple

import numpy as np


class PrefixMatch(NamedTuple):
    """A replica's cached prefix of a prompt, as the engine's `KVCacheManager.match` sees it:
    a run of device blocks (pending marks count as device), then a run of host blocks."""

    num_device_blocks: int
    num_host_blocks: int

    @property
    def num_cached_blocks(self) -> int:
        return self.num_device_blocks + self.num_host_blocks

    def hit_tokens(self, block_size: int, num_prompt_tokens: int) -> tuple[int, int]:
        """(device, host) prompt tokens this prefix covers, capped at the prompt length."""
        device_tokens = min(self.num_device_blocks * block_size, num_prompt_tokens)
        host_tokens = min(self.num_host_blocks * block_size, num_prompt_tokens - device_tokens)
        return device_tokens, host_tokens



class PrefixMatches(Mapping[str, PrefixMatch]):
    """Replica id -> PrefixMatch, for the replicas with at least one cached block, held as
    arrays: when most of a large fleet shares a prompt's prefix, a decision that scores the
    candidates as arrays (cache_aware) builds no object per replica. Read-only.

    Args:
        replica_ids: the replicas, in no particular order.
        device_blocks: [n] int, each one's device run.
        cached_blocks: [n] int, each one's device run plus the host run after it (> 0).
    """

    __slots__ = ("replica_ids", "device_blocks", "cached_blocks", "_positions")

    def __init__(self, replica_ids: list[str], device_blocks: np.ndarray,
                 cached_blocks: np.ndarray):
        self.replica_ids = replica_ids
        self.device_blocks = device_blocks
        self.cached_blocks = cached_blocks
        self._positions: dict[str, int] | None = None

    def __getitem__(self, replica_id: str) -> PrefixMatch:
        if self._positions is None:
            self._positions = dict(zip(self.replica_ids, range(len(self.replica_ids))))
        i = self._positions[replica_id]
        device = int(self.device_blocks[i])
        return PrefixMatch(device, int(self.cached_blocks[i]) - device)

    def get(self, replica_id: str, default: PrefixMatch | None = None) -> PrefixMatch | None:
        """One replica's match (a decision asks for its pick's): a scan of the ids in C,
        where `Mapping.get` would build the position of every replica."""
        if self._positions is None:
            try:
                i = self.replica_ids.index(replica_id)
            except ValueError:
                return default
        else:
            i = self._positions.get(replica_id)
            if i is None:
                return default
        device = int(self.device_blocks[i])
        return PrefixMatch(device, int(self.cached_blocks[i]) - device)

    def __iter__(self) -> Iterator[str]:
        return iter(self.replica_ids)

    def __len__(self) -> int:
        return len(self.replica_ids)

    def items(self) -> ItemsView[str, PrefixMatch]:
        return dict(zip(self.replica_ids, map(
            tuple.__new__, repeat(PrefixMatch),
            zip(self.device_blocks.tolist(), (self.cached_blocks - self.device_blocks).tolist()
                )))).items()

    def __repr__(self) -> str:
        return f"PrefixMatches({dict(self.items())!r})"
