"""From a validated OpenAI body to what the engine takes: sampling, the context check, and
one engine request per choice.

Both OpenAI servers (the gateway and the standalone engine) answer the same bad input the
same way: a 400 naming the parameter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

from protocol.engine import EngineInputError, EngineRequest, SamplingParams
from worker.openai.errors import APIError
from worker.openai.schema import ChatCompletionRequest, CompletionRequest

Kind = Literal["completion", "chat"]


def max_new_tokens(body: CompletionRequest | ChatCompletionRequest) -> int:
    """The output tokens asked for (OpenAI's default of 16 when unset)."""
    return body.output_tokens()


def check_context_length(kind: Kind, num_prompt_tokens: int, max_tokens: int,
                         max_model_len_tokens: int) -> None:
    """Raises APIError(400, context_length_exceeded) when prompt + output do not fit."""
    if num_prompt_tokens + max_tokens > max_model_len_tokens:
        raise APIError(400, f"this model's maximum context length is "
                            f"{max_model_len_tokens} tokens; the prompt has "
                            f"{num_prompt_tokens} and max_tokens is {max_tokens}",
                       param="messages" if kind == "chat" else "prompt",
                       code="context_length_exceeded")


def sampling_params(body: CompletionRequest | ChatCompletionRequest,
                    max_tokens: int) -> SamplingParams:
    """The engine's sampling parameters; APIError(400) when the engine refuses them."""
    try:
        return SamplingParams(max_tokens=max_tokens, temperature=body.temperature,
                              top_k=max(body.top_k, 0), top_p=body.top_p, min_p=body.min_p,
                              seed=body.seed,
                              stop=body.stop_strings(), ignore_eos=body.ignore_eos,
                              stop_token_ids=tuple(body.stop_token_ids or ()),
                              min_tokens=body.min_tokens,
                              logprobs=body.top_logprobs_count())
    except EngineInputError as err:
        raise APIError(400, str(err)) from None


def engine_requests(kind: Kind, response_id: str, body: CompletionRequest | ChatCompletionRequest,
                    prompts_token_ids: list[list[int]], max_model_len_tokens: int,
                    cache_salt: str = "",
                    block_hashes_of: Callable[[list[int]], list[bytes]] | None = None
                    ) -> list[EngineRequest]:
    """One engine request per choice, in OpenAI's choice order: choice `p * n + j` is the
    j-th of prompt p. Every prompt must fit the context with max_tokens (a 400 naming the
    prompt otherwise). A request with one choice keeps `response_id` as its engine request
    id; choice i of several gets `{response_id}-{i}`. With a seed, choice j of its prompt
    samples with seed + j (as vLLM does), so the n choices differ and each is repeatable.
    """
    max_tokens = max_new_tokens(body)
    sampling = sampling_params(body, max_tokens)
    single = len(prompts_token_ids) == 1 and body.n == 1
    requests = []
    for p, token_ids in enumerate(prompts_token_ids):
        check_context_length(kind, len(token_ids), max_tokens, max_model_len_tokens)
        hashes = block_hashes_of(token_ids) if block_hashes_of is not None else None
        for j in range(body.n):
            index = p * body.n + j
            sp = sampling if sampling.seed is None or not j else dataclasses.replace(
                sampling, seed=sampling.seed + j)
            requests.append(EngineRequest(response_id if single else f"{response_id}-{index}",
                                          token_ids, sp, block_hashes=hashes,
                                          cache_salt=cache_salt))
    return requests
