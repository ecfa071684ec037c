"""What of a client's body the external gateway forwards to a worker: an allowlist.

A worker (vLLM, SGLang) honours many extensions of its own that one tenant must not reach
through kvroute: `kv_transfer_params` (KV transfer to or from any address), `chat_template`
(templates run on the worker), media URLs in messages (fetched by the worker), sampling
knobs that cost every tenant. The gateway forwards OpenAI's documented fields plus the
vLLM sampling extensions kvroute documents (docs/parameters.md):

- any other top-level field is dropped (as kvroute's own servers ignore a field they do not
  know), and `cache_salt` is the gateway's (the tenant's) or none;
- a chat content part other than text (an image, audio or file part: a URL or data the
  worker would fetch or decode) is refused with a 400 naming it.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from worker.openai.errors import APIError
from worker.openai.limits import PYTHON_PARSE_MAX_BYTES

_OPENAI_COMMON = frozenset({
    "model", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "temperature", "top_p",
    "user"})
# vLLM's sampling extensions that kvroute's own engine honours too (docs/parameters.md)
_EXTENSIONS = frozenset({"top_k", "ignore_eos", "min_tokens", "stop_token_ids"})
COMPLETION_FIELDS = _OPENAI_COMMON | _EXTENSIONS | {"prompt", "best_of", "echo", "suffix"}
CHAT_FIELDS = _OPENAI_COMMON | _EXTENSIONS | {
    "messages", "max_completion_tokens", "top_logprobs", "parallel_tool_calls",
    "response_format", "tool_choice", "tools", "metadata", "store", "service_tier",
    "reasoning_effort"}
_ENCODER = msgspec.json.Encoder()  # a batch of millions of token ids: ~10x json.dumps


def forward_body(data: dict[str, Any], raw: bytes, fields: frozenset[str] | None,
                 tenant: str) -> bytes:
    """What goes to the worker of a body the gateway parsed (`data`, read from `raw`): only
    `fields` (None: every field and content part) and, with a tenant, its `cache_salt` (the
    tenant's, never the client's own, so tenants share no KV on the worker either; vLLM
    reads it). `raw` itself when nothing changes: the body is parsed once, off the loop,
    however large.

    Raises APIError(400), with `fields`, for a chat content part that is not text.
    """
    if fields is not None:
        _check_text_parts(data)
    if not tenant and (fields is None or fields.issuperset(data)):
        return raw
    kept = data if fields is None else {k: v for k, v in data.items() if k in fields}
    if tenant:
        kept = {**kept, "cache_salt": tenant}
    if len(raw) <= PYTHON_PARSE_MAX_BYTES:
        # Python's parser may have read it (NaN, Infinity, a lone surrogate): written back
        # as the client sent it, for the worker to refuse, not made null or an error here
        return json.dumps(kept, separators=(",", ":")).encode()
    return _ENCODER.encode(kept)  # msgspec parsed it: nothing msgspec cannot write


def _check_text_parts(data: dict[str, Any]) -> None:
    for i, message in enumerate(data.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if not (isinstance(part, dict) and part.get("type") == "text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise APIError(400, f"only text content parts are forwarded to workers, "
                                    f"got {kind!r}", param=f"messages.{i}.content.{j}",
                               code="invalid_value")
