"""What a prefix walk returns: per replica, its cached prefix of the prompt."""

from __future__ import annotations

from typing import NamedTuple


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


def collect_matches(device_ends: list[tuple[int, int]], total_ends: list[tuple[int, int]],
                    replica_of_slot: dict[int, str]) -> dict[str, PrefixMatch]:
    """Turns a walk's run ends into matches.

    Args:
        device_ends: (device bits, length of their device run), device bit of slot s = 2s.
        total_ends: (device bits, length of their device run plus the host run after it).
        replica_of_slot: slot -> replica id.

    Returns:
        replica id -> PrefixMatch, for replicas with at least one cached block.
    """
    new = tuple.__new__  # skips NamedTuple's Python-level __new__: this runs per replica
    device_len: dict[int, int] = {}
    for bits, n in device_ends:
        if n:
            for slot in _slots(bits):
                device_len[slot] = n
    out: dict[str, PrefixMatch] = {}
    for bits, n in total_ends:
        if n:
            for slot in _slots(bits):
                d = device_len.get(slot, 0)
                out[replica_of_slot[slot]] = new(PrefixMatch, (d, n - d))
    return out


def _slots(device_bits: int):
    while device_bits:
        low = device_bits & -device_bits
        yield (low.bit_length() - 1) >> 1
        device_bits ^= low
