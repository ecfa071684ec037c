"""A request's state inside one engine replica."""

from __future__ import annotations

import enum
import time

from kv.hashing import BlockHash, block_hashes
from protocol.engine import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """Token ids (prompt then output), how many are computed, and the prompt's block hashes.

    `block_hashes` grows as generated tokens fill blocks, so a finished chat's history is
    cached for its next turn.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                 block_size: int, root: BlockHash, prompt_block_hashes: list[bytes] | None = None,
                 arrival_time: float | None = None):
        self.request_id = request_id
        self.sampling = sampling
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.block_size = block_size
        self.root = root
        self.block_hashes: list[BlockHash] = (
            list(prompt_block_hashes) if prompt_block_hashes is not None
            else block_hashes(prompt_token_ids, block_size, root))
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.first_scheduled_time: float | None = None  # its first admission to a step
        self.num_preemptions = 0
        # Prompt tokens served from cache at the (last) admission, for usage and metrics.
        self.num_cached_device_tokens = 0
        self.num_cached_host_tokens = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        num_full = len(self.token_ids) // self.block_size
        if num_full > len(self.block_hashes):
            parent = self.block_hashes[-1] if self.block_hashes else self.root
            self.block_hashes.extend(block_hashes(self.token_ids, self.block_size, self.root,
                                                  len(self.block_hashes), parent))

    def __repr__(self) -> str:
        return (f"Request({self.request_id}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")
