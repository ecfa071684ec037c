"""The engine's public API types: what the gateway sends and what a replica streams back.

These cross process boundaries (Ray calls), so they are plain frozen dataclasses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple


class EngineInputError(ValueError):
    """A request the engine cannot serve as asked (the gateway maps it to HTTP 400)."""


class EngineUnhealthyError(RuntimeError):
    """The engine cannot serve any request (its health check fails; Serve replaces it)."""


class EngineUnavailableError(RuntimeError):
    """The engine takes no new requests (it is shutting down): the request was not accepted
    and may go to another replica (the gateway retries, then answers HTTP 503)."""


MAX_LOGPROBS = 20  # most likely alternatives a request may ask for per token (OpenAI's cap)
# stop token ids one request may give: the sampler masks them and the scheduler looks each
# sampled token up in them at every step, so a client-sized list would cost every step
MAX_STOP_TOKEN_IDS = 256
SEED_RANGE = (-(2**63), 2**64)  # what torch.Generator.manual_seed takes


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings, matched on the detokenized output
    ignore_eos: bool = False
    # EOS, stop_token_ids and stop strings cannot end the output before this many tokens
    # (vLLM's extension); the sampler does not sample EOS or a stop token id before then.
    min_tokens: int = 0
    # None: no log-probabilities; k >= 0: the sampled token's and the k most likely ones'
    logprobs: int | None = None
    # tokens less likely than min_p x the most likely one are not sampled (vLLM's); 0 = off
    min_p: float = 0.0

    def __post_init__(self):
        def bad(what: str) -> EngineInputError:
            return EngineInputError(f"invalid sampling parameter: {what}")

        def is_int(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_number(v: object) -> bool:
            return (is_int(v) or isinstance(v, float)) and math.isfinite(v)

        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not is_number(self.temperature) or self.temperature < 0:
            raise bad(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not is_int(self.top_k) or self.top_k < 0:
            raise bad(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise bad(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and not (is_int(self.seed)
                                          and SEED_RANGE[0] <= self.seed < SEED_RANGE[1]):
            raise bad(f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise bad(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids, got "
                      f"{len(self.stop_token_ids)}")
        if any(not is_int(t) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids must be non-negative integers")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop must be non-empty strings")
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise bad(f"min_tokens must be an integer in [0, max_tokens], got "
                      f"{self.min_tokens!r}")
        if self.logprobs is not None and not (is_int(self.logprobs)
                                              and 0 <= self.logprobs <= MAX_LOGPROBS):
            raise bad(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got "
                      f"{self.logprobs!r}")


class TokenLogprobs(NamedTuple):
    """The log-probability of one sampled token under the model's own distribution (the
    raw logits, before temperature, top-k and top-p), and the `k` most likely tokens with
    theirs, most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class SampledToken(NamedTuple):
    """What an executor returns per sampled request: the token, and its log-probabilities
    when the request asked for them."""

    token_id: int
    logprobs: TokenLogprobs | None = None


class SampleFailure(NamedTuple):
    """What an executor returns for a request whose own sampling failed (its logits row or
    its parameters): that request ends with "error" and the step goes on for the others."""

    error: str


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Protocol 1 hashes of the prompt's full blocks, computed once by the gateway; the
    # engine computes them itself when absent. They must use the engine's block size.
    block_hashes: list[bytes] | None = None
    adapter: str = ""  # LoRA adapter name (part of the hash namespace)
    cache_salt: str = ""  # tenant salt (part of the hash namespace)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens_device: int  # prompt tokens served from the device prefix cache
    cached_tokens_host: int  # prompt tokens copied back from the host tier

    @property
    def cached_tokens(self) -> int:
        return self.cached_tokens_device + self.cached_tokens_host


@dataclass(frozen=True)
class TokenDelta:
    """New tokens of one request; the last delta has `finish_reason` and `usage`."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    usage: Usage | None = None
    error: str | None = None  # set with finish_reason "error"
    # one entry per token in `token_ids` when the request asked for logprobs, else None
    logprobs: list[TokenLogprobs] | None = None
    # On a request's first delta only: seconds from the engine first scheduling the request
    # to its first token (the gateway's TTFT minus this is the request's queue time).
    first_token_compute_s: float | None = None


@dataclass(frozen=True)
class EngineStats:
    """A replica's load and cache state, published with its KV events."""

    num_running: int
    num_waiting: int
    num_queued_prefill_tokens: int  # uncached prompt tokens not yet computed
    num_blocks: int
    num_used_blocks: int
    num_cached_blocks: int  # free but findable by hash
    num_pinned_blocks: int
    num_free_blocks: int
    num_host_blocks: int
    num_host_cached_blocks: int


# Pinned-prefix calls and operator queries. The request router reads `block_hashes`,
# `prompt_token_ids` and `target_replica_id` from the first argument of a call, so every
# routed message carries them (a request to a specific replica sets the third).


@dataclass(frozen=True)
class PinRequest:
    """Compute a named prefix on the replica the router picks and pin its blocks."""

    name: str
    prompt_token_ids: list[int]
    block_hashes: list[bytes]
    cache_salt: str = ""
    target_replica_id: str | None = None


@dataclass(frozen=True)
class PinResult:
    replica_id: str
    num_pinned_blocks: int


@dataclass(frozen=True)
class UnpinRequest:
    """Unpin a named prefix on the replica that holds it (routed there by id)."""

    name: str
    target_replica_id: str
    prompt_token_ids: tuple[int, ...] = ()
    block_hashes: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class ReplicaQuery:
    """An operator's question to one replica (routed there by id)."""

    target_replica_id: str


@dataclass(frozen=True)
class PinnedPrefix:
    """A prefix a replica holds pinned, as it reports it to the KV index actor (so a
    restarted actor rebuilds its prefix records from the replicas)."""

    name: str  # the engine's pin name
    cache_salt: str
    prompt_token_ids: tuple[int, ...]
    num_pinned_blocks: int
