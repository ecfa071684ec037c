"""From a validated OpenAI body to what the engine takes: sampling and the context check.

Both OpenAI servers (the gateway and the standalone engine) answer the same bad input the
same way: a 400 naming the parameter.
"""

from __future__ import annotations

from typing import Literal

from worker.api import EngineInputError, SamplingParams
from worker.openai.errors import APIError
from worker.openai.schema import DEFAULT_MAX_TOKENS, ChatCompletionRequest, CompletionRequest

Kind = Literal["completion", "chat"]


def max_new_tokens(body: CompletionRequest | ChatCompletionRequest) -> int:
    """The output tokens asked for (OpenAI's default of 16 when unset)."""
    if isinstance(body, ChatCompletionRequest):
        return body.max_new_tokens() or DEFAULT_MAX_TOKENS
    return body.max_tokens or DEFAULT_MAX_TOKENS


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
                              top_k=body.top_k, top_p=body.top_p, seed=body.seed,
                              stop=body.stop_strings(), ignore_eos=body.ignore_eos,
                              stop_token_ids=tuple(body.stop_token_ids or ()))
    except EngineInputError as err:
        raise APIError(400, str(err)) from None
