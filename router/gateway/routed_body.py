"""What the gateway reads of a request it forwards to an external worker: what the routers'
one body reader reads (router/front/routing_body.py: the prompt's token ids to hash and
route, the output as the load term, every number bounded before it reaches the router),
after the model check, and with the workers' context length when one lists it. Nothing
else is checked here (the worker validates the rest: it may
accept parameters kvroute's own engine does not), and the body goes out as it came, unless
a field off the allowlist or a tenant's cache salt changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from router.front.routing_body import (
    Context,
    RoutingRead,
    load_json,
    read_chat,
    read_completion,
)
from router.gateway.external_fields import forward_body
from worker.openai.errors import APIError
from worker.openai.limits import RequestLimits
from worker.openai.prompt import PromptBuilder
from worker.openai.schema import DEFAULT_LIMITS


@dataclass(frozen=True)
class RoutedBody:
    token_ids: list[int]  # the (first) prompt's ids, as the worker will see them
    # output tokens asked for (OpenAI's default when unset), times the sequences (n x the
    # prompts of a batch): the most the request makes its worker generate
    max_tokens: int
    body: bytes  # what goes to the worker
    stream: bool = False  # asked for a stream (holds one of its tenant's stream slots)
    num_sequences: int = 1  # n x the prompts of a batch: the completions it makes


def _load(raw: bytes, model: str, limits: RequestLimits, context: Context | None
          ) -> dict[str, Any]:
    data = load_json(raw, limits, None if context is None else context.max_model_len_tokens)
    if data.get("model") != model:
        raise APIError(404, f"the model {data.get('model')!r} does not exist; this server "
                            f"serves {model!r}", param="model", code="model_not_found")
    return data


def _routed(read: RoutingRead, data: dict[str, Any], raw: bytes, tenant: str,
            fields: frozenset[str] | None) -> RoutedBody:
    """The body to forward (router/gateway/external_fields.py: `fields` only, the tenant's
    salt), from the one parse of it."""
    return RoutedBody(read.token_ids, read.output.total, forward_body(data, raw, fields, tenant),
                      read.stream, read.output.num_sequences)


def completion_body(raw: bytes, prompts: PromptBuilder, model: str, tenant: str,
                    limits: RequestLimits = DEFAULT_LIMITS, context: Context | None = None,
                    fields: frozenset[str] | None = None) -> RoutedBody:
    """A /v1/completions body. A batch of prompts is routed on its first one. With the
    workers' `context`, a prompt (text or ids) or output that cannot fit it is a 400 here,
    before it is routed or charged to a worker's load."""
    data = _load(raw, model, limits, context)
    return _routed(read_completion(data, prompts, limits, context), data, raw, tenant,
                   fields)


def chat_body(raw: bytes, prompts: PromptBuilder, model: str, tenant: str,
              limits: RequestLimits = DEFAULT_LIMITS, context: Context | None = None,
              fields: frozenset[str] | None = None) -> RoutedBody:
    """A /v1/chat/completions body, through the model's chat template (`context`: as for
    `completion_body`)."""
    data = _load(raw, model, limits, context)
    return _routed(read_chat(data, prompts, limits, context), data, raw, tenant, fields)
