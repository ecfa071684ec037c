"""What rank 0 sends every TP rank each step: the scheduled tokens and the block copies."""

from __future__ import annotations

from dataclasses import dataclass

from kv.manager import CopyPlan


@dataclass(frozen=True)
class ScheduledSeq:
    request_id: str
    token_ids: list[int]  # the tokens computed this step (len = num_new_tokens >= 1)
    start_pos: int  # tokens already in the KV cache; positions = start_pos .. start_pos+len-1
    block_ids: list[int]  # the request's whole block table, covering start_pos + len(token_ids)
    sample: bool  # True: return logits for the last token of this chunk
    skip_kv_write: int = 0  # leading tokens of this chunk whose KV is already cached
    # output tokens the request has so far (the sampler keeps EOS and stop tokens out of a
    # request still short of its min_tokens)
    num_output_tokens: int = 0


@dataclass(frozen=True)
class StepInput:
    seqs: list[ScheduledSeq]
    copies: CopyPlan  # the KV manager's host-tier copies, run before the forward

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)
