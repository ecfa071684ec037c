"""The contract between the engine loop and whatever computes a step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from protocol.engine import SampledToken, SampleFailure, SamplingParams
from worker.engine.step import StepInput


class Executor(Protocol):
    """Computes one scheduled step and samples the next token of each finished chunk.

    Contract:
    - `execute` runs the step's block copies (swap out, then swap in) before its forward;
      it returns `{request_id: SampledToken}` for exactly the seqs with `sample=True`,
      with the token's log-probabilities when the request's `logprobs` is set, or a
      `SampleFailure` for a request whose own sampling failed (only it ends, with "error").
    - a seq whose `num_output_tokens` is below its request's `min_tokens` never samples
      an EOS token or one of its `stop_token_ids`.
    - `sampling` has the params of every sampled request; an executor keeps per-request
      sampling state (seeded generators) until `release(request_id)`.
    - `execute` is called from one worker thread at a time; it must not touch the
      scheduler or the KV manager.
    - `vocab_size` and `eos_token_ids` describe the model it runs.
    """

    vocab_size: int
    eos_token_ids: tuple[int, ...]

    def execute(self, step: StepInput, sampling: Mapping[str, SamplingParams]
                ) -> dict[str, SampledToken | SampleFailure]: ...

    def release(self, request_id: str) -> None: ...

    def shutdown(self) -> None: ...
