"""What a router reads of a client's body to route it: one reader for the ingress router
(router/serve/route_calls.py) and the gateway to external workers
(router/gateway/routed_body.py), with one set of rules.

- The prompt: a string, a list of token ids, or a batch of either (routed on its first
  prompt); chat messages through the model's chat template (text parts only).
- The output it asks for (`output_tokens`): `max_completion_tokens` wins over `max_tokens`
  (OpenAI's default when neither is set), times n times the prompts of a batch; n and the
  output length must be JSON integers >= 1, the sequences within the cap.
- Every number that reaches a router's load is bounded first, and text is measured before
  it is tokenized: the limits' prompt characters, and, where the context length is known,
  text that cannot fit it (no token stands for more characters than the vocabulary's
  longest piece) and prompt + output over it.

A body that breaks a rule raises APIError (4xx); each caller decides what that means (the
external gateway answers it; the ingress router routes such a body by load alone and lets
the replica answer it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from worker.openai.errors import APIError
from worker.openai.limits import (
    RequestLimits,
    check_sequences,
    check_text_fits,
    check_text_length,
    load_object,
)
from worker.openai.prompt import PromptBuilder, PromptError
from worker.openai.schema import DEFAULT_MAX_TOKENS, are_token_ids

T = TypeVar("T")
# A body up to this size is read on the event loop (tokenizing it takes a few ms at most); a
# larger one in a thread: a prompt at the size limit takes seconds to tokenize, and a
# router's loop serves every tenant (the tokenizer releases the GIL on long text).
INLINE_BODY_BYTES = 8 * 1024


class OutputTokens(NamedTuple):
    per_sequence: int  # max_completion_tokens, else max_tokens, else OpenAI's default
    num_sequences: int  # n x the prompts of a batch

    @property
    def total(self) -> int:
        """The most the request makes its replica generate: its load."""
        return self.per_sequence * self.num_sequences


@dataclass(frozen=True)
class Context:
    """What a reader knows of the model's context: its length in tokens and the longest
    token's characters (`longest_token_chars`), to refuse text before tokenizing it."""

    max_model_len_tokens: int
    max_token_chars: int

    def __post_init__(self):
        if self.max_model_len_tokens < 1 or self.max_token_chars < 1:
            raise ValueError(f"Context: both >= 1 required, got {self}")


@dataclass(frozen=True)
class RoutingRead:
    token_ids: list[int]  # the (first) prompt's ids, as the server will see them
    output: OutputTokens
    stream: bool  # asked for a stream


async def off_loop(threads: Executor, num_bytes: int, read: Callable[[], T]) -> T:
    """`read()` (a read of a body of `num_bytes`): on the loop when the body is small, else
    in one of `threads`."""
    if num_bytes <= INLINE_BODY_BYTES:
        return read()
    return await asyncio.get_running_loop().run_in_executor(threads, read)


def load_json(raw: bytes, limits: RequestLimits, max_model_len_tokens: int | None = None
              ) -> dict[str, Any]:
    """The body as a JSON object, within the size and nesting limits and holding no more
    values than a request to the context needs, else 400/413: checked before it is parsed
    (worker/openai/limits.py: load_object)."""
    return load_object(raw, limits, max_model_len_tokens)


def read_completion(data: dict[str, Any], prompts: PromptBuilder, limits: RequestLimits,
                    context: Context | None = None) -> RoutingRead:
    """A /v1/completions body. A batch of prompts is routed on its first one."""
    prompt = data.get("prompt")
    num_prompts = 1
    texts = [prompt] if isinstance(prompt, str) else []
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        num_prompts = len(prompt)
        texts = [p for p in prompt if isinstance(p, str)]
        prompt = prompt[0]  # a batch: its first prompt
    check_text_length(sum(map(len, texts)), limits, "prompt")
    if context is not None and texts:
        check_text_fits(max(map(len, texts)), context.max_model_len_tokens,
                        context.max_token_chars, "prompt")
    output = output_tokens(data, limits, num_prompts, context)  # before any tokenizing
    if isinstance(prompt, str) and prompt:
        token_ids = prompts.encode_text(prompt)
    elif are_token_ids(prompt):
        token_ids = prompt
    else:
        raise APIError(400, "prompt must be a non-empty string or list of token ids "
                            "(or a list of them)", param="prompt", code="invalid_value")
    return _fitted(RoutingRead(token_ids, output, data.get("stream") is True), context,
                   "prompt")


def read_chat(data: dict[str, Any], prompts: PromptBuilder, limits: RequestLimits,
              context: Context | None = None) -> RoutingRead:
    """A /v1/chat/completions body, through the model's chat template (text parts only:
    other parts, such as images, take no part in routing)."""
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list", param="messages",
                       code="invalid_value")
    rendered = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a role",
                           param=f"messages.{i}", code="invalid_value")
        rendered.append({"role": message["role"], "content": _text(message.get("content"))})
    num_chars = sum(len(m["content"]) for m in rendered)
    check_text_length(num_chars, limits, "messages")
    if context is not None:
        check_text_fits(num_chars, context.max_model_len_tokens, context.max_token_chars,
                        "messages")
    output = output_tokens(data, limits, 1, context)
    try:
        token_ids = prompts.encode_chat(rendered)
    except PromptError as err:
        raise APIError(400, str(err), param="messages") from None
    return _fitted(RoutingRead(token_ids, output, data.get("stream") is True), context,
                   "messages")


def output_tokens(data: dict[str, Any], limits: RequestLimits, num_prompts: int = 1,
                  context: Context | None = None) -> OutputTokens:
    """The output a body asks for, every number checked as kvroute's engine checks it, so
    whatever the router charges for it is bounded: 400 when n or the output length is not
    an integer (a bool, a float, a string) or is below 1, when the sequences are over the
    cap, or when the output alone is longer than the context (when known, else
    `limits.max_output_tokens`). `max_completion_tokens` wins over `max_tokens`."""
    n = data.get("n")
    if n is None:
        n = 1
    elif not _is_int(n) or n < 1:
        raise APIError(400, f"n must be an integer >= 1, got {_shown(n)}", param="n",
                       code="invalid_value")
    check_sequences(num_prompts, n, limits)
    key = ("max_completion_tokens" if data.get("max_completion_tokens") is not None
           else "max_tokens")
    value = data.get(key)
    if value is None:
        return OutputTokens(DEFAULT_MAX_TOKENS, num_prompts * n)
    if not _is_int(value) or value < 1:
        raise APIError(400, f"{key} must be an integer >= 1, got {_shown(value)}", param=key,
                       code="invalid_value")
    cap = limits.max_output_tokens if context is None else context.max_model_len_tokens
    if value > cap:
        raise APIError(400, f"{key} is over the model's context of {cap} tokens",
                       param=key, code="context_length_exceeded")
    return OutputTokens(value, num_prompts * n)


def _fitted(read: RoutingRead, context: Context | None, param: str) -> RoutingRead:
    """`read`, unless its prompt and output cannot fit the context (when known)."""
    if context is not None and (len(read.token_ids) + read.output.per_sequence
                                > context.max_model_len_tokens):
        raise APIError(400, f"the prompt ({len(read.token_ids)} tokens) and the output "
                            f"({read.output.per_sequence}) are over the model's context of "
                            f"{context.max_model_len_tokens} tokens", param=param,
                       code="context_length_exceeded")
    return read


def _is_int(value: Any) -> bool:
    return type(value) is int  # JSON integers; leaves out bools and floats


def _shown(value: Any) -> str:
    if _is_int(value) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."




def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str))
    return ""
