"""What the gateway reads of a request it forwards to an external worker: the prompt's token
ids (to hash and route), the output length (the load term) and the sequences it starts (n x
the prompts of a batch, capped as kvroute's own servers cap them). Before any of it is
tokenized, the body's size, nesting and prompt text are checked against the gateway's
limits (worker/openai/limits.py). Nothing else is checked here (the worker validates the
rest: it may accept parameters kvroute's own engine does not), and the body goes out as it
came, unless a tenant's cache salt must be set in it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

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


def _max_tokens(data: dict[str, Any], limits: RequestLimits, num_prompts: int = 1) -> int:
    """All the output tokens the request may make (400 over the sequence cap)."""
    n = data.get("n", 1)
    if type(n) is not int or n < 1:
        n = 1  # the worker answers a bad n
    check_sequences(num_prompts, n, limits)
    for key in ("max_completion_tokens", "max_tokens"):
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value * num_prompts * n
    return DEFAULT_MAX_TOKENS * num_prompts * n


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
    if isinstance(prompt, str) and prompt:
        token_ids = prompts.encode_text(prompt)
    elif isinstance(prompt, list) and _token_ids(prompt):
        token_ids = prompt
    else:
        raise APIError(400, "prompt must be a non-empty string or list of token ids "
                            "(or a list of them)", param="prompt", code="invalid_value")
    return RoutedBody(token_ids, _max_tokens(data, limits, num_prompts),
                      _out(data, raw, tenant), data.get("stream") is True)


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
    try:
        token_ids = prompts.encode_chat(rendered)
    except PromptError as err:
        raise APIError(400, str(err), param="messages") from None
    return RoutedBody(token_ids, _max_tokens(data, limits), _out(data, raw, tenant),
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
