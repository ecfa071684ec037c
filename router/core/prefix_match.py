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

