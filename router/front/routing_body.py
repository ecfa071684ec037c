"""What the gateway reads of a request it forwards to an external worker: the prompt's token
ids (to hash and route), the output length (the load term) and the sequences it starts (n x
the prompts of a batch, capped as kvroute's own servers cap them). Before any of it is
tokenized, the body's size, nesting and prompt text are checked against the gateway's
limits (worker/openai/limits.py), and the numbers that set the router's load (n, the output
length) are checked as the engine checks them (`output_tokens`, which the ingress router
uses too): a bad one is a 400 before it reaches the router. Nothing else is checked here
(the worker validates the rest: it may accept parameters kvroute's own engine does not),
and the body goes out as it came, unless a tenant's cache salt must be set in it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from worker.openai.errors import APIError
from worker.openai.limits import (
    RequestLimits,
    check_body_size,
    check_json_depth,
    check_sequences,
    check_text_length,
)
from worker.openai.prompt import PromptBuilder, PromptError
from worker.openai.schema import DEFAULT_LIMITS, DEFAULT_MAX_TOKENS


@dataclass(frozen=True)
class RoutedBody:
    token_ids: list[int]  # the (first) prompt's ids, as the worker will see them
    # output tokens asked for (OpenAI's default when unset), times the sequences (n x the
    # prompts of a batch): the most the request makes its worker generate
    max_tokens: int
    body: bytes  # what goes to the worker
    stream: bool = False  # asked for a stream (holds one of its tenant's stream slots)


def _load(raw: bytes, model: str, limits: RequestLimits) -> dict[str, Any]:
    check_body_size(len(raw), limits)
    check_json_depth(raw, limits)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise APIError(400, f"the request body is not valid JSON: {err}",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    if data.get("model") != model:
        raise APIError(404, f"the model {data.get('model')!r} does not exist; this server "
                            f"serves {model!r}", param="model", code="model_not_found")
    return data


class OutputTokens(NamedTuple):
    per_sequence: int  # max_completion_tokens, else max_tokens, else OpenAI's default
    num_sequences: int  # n x the prompts of a batch

    @property
    def total(self) -> int:
        """The most the request makes its replica generate: its load."""
        return self.per_sequence * self.num_sequences


def output_tokens(data: dict[str, Any], limits: RequestLimits, num_prompts: int = 1,
                  max_model_len: int | None = None) -> OutputTokens:
    """The output a body asks for, every number checked as kvroute's engine checks it, so
    whatever the router charges for it is bounded: 400 when n or the output length is not
    an integer (a bool, a float, a string) or is below 1, when the sequences are over the
    cap, or when the output alone is longer than the context (`max_model_len` when known,
    else `limits.max_output_tokens`). `max_completion_tokens` wins over `max_tokens`."""
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
    cap = limits.max_output_tokens if max_model_len is None else max_model_len
    if value > cap:
        raise APIError(400, f"{key} is over the model's context of {cap} tokens",
                       param=key, code="context_length_exceeded")
    return OutputTokens(value, num_prompts * n)


def _is_int(value: Any) -> bool:
    return type(value) is int  # JSON integers; leaves out bools and floats


def _shown(value: Any) -> str:
    if _is_int(value) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _out(data: dict[str, Any], raw: bytes, tenant: str) -> bytes:
    """The body to forward: as received, or with the tenant's salt (never the client's own,
    so tenants share no KV on the worker either; vLLM reads `cache_salt`)."""
    if not tenant:
        return raw
    return json.dumps({**data, "cache_salt": tenant}, separators=(",", ":")).encode()


def completion_body(raw: bytes, prompts: PromptBuilder, model: str, tenant: str,
                    limits: RequestLimits = DEFAULT_LIMITS) -> RoutedBody:
    """A /v1/completions body. A batch of prompts is routed on its first one."""
    data = _load(raw, model, limits)
    prompt = data.get("prompt")
    num_prompts = 1
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        num_prompts = len(prompt)
        num_chars = sum(len(p) for p in prompt if isinstance(p, str))
        prompt = prompt[0]  # a batch: its first prompt
    else:
        num_chars = len(prompt) if isinstance(prompt, str) else 0
    check_text_length(num_chars, limits, "prompt")
    output = output_tokens(data, limits, num_prompts)  # checked before any tokenizing
    if isinstance(prompt, str) and prompt:
        token_ids = prompts.encode_text(prompt)
    elif isinstance(prompt, list) and _token_ids(prompt):
        token_ids = prompt
    else:
        raise APIError(400, "prompt must be a non-empty string or list of token ids "
                            "(or a list of them)", param="prompt", code="invalid_value")
    return RoutedBody(token_ids, output.total, _out(data, raw, tenant),
                      data.get("stream") is True)


def chat_body(raw: bytes, prompts: PromptBuilder, model: str, tenant: str,
              limits: RequestLimits = DEFAULT_LIMITS) -> RoutedBody:
    """A /v1/chat/completions body, through the model's chat template (text parts only:
    other parts, such as images, do not take part in routing)."""
    data = _load(raw, model, limits)
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
    check_text_length(sum(len(m["content"]) for m in rendered), limits, "messages")
    output = output_tokens(data, limits)
    try:
        token_ids = prompts.encode_chat(rendered)
    except PromptError as err:
        raise APIError(400, str(err), param="messages") from None
    return RoutedBody(token_ids, output.total, _out(data, raw, tenant),
                      data.get("stream") is True)


def _token_ids(values: list) -> bool:
    """Non-empty, all uint32 (JSON ints; `type is int` leaves out bools). C-speed checks:
    a prompt has thousands of ids and this runs on every request."""
    return (bool(values) and set(map(type, values)) == {int}
            and min(values) >= 0 and max(values) < 2**32)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str))
    return ""
