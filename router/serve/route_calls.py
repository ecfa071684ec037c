"""What the ingress request router reads of a client's body to route it: the tenant from the
API key, the prompt's token ids (chat template included), their Protocol 1 block hashes and
the output the request asks for.

Every number that reaches the router's load is checked first, as the engine replica checks
it (`output_tokens`, shared with the worker gateway): a body the replica will refuse
(a bad or unbounded n or max_tokens, a prompt that cannot fit the context, token ids out of
range) is not routed on its prompt, so it charges no replica, and the replica it goes to
answers the client's 4xx. Text is measured before it is tokenized: a prompt with more
characters than the context can hold is refused without tokenizing it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from router.gateway.routed_body import output_tokens
from router.gateway.tenants import TenantAuth
from worker.openai.errors import APIError
from worker.openai.limits import (
    RequestLimits,
    check_body_size,
    check_json_depth,
    check_text_fits,
    check_text_length,
    longest_token_chars,
)
from worker.openai.prompt import PromptBuilder, PromptError
from worker.openai.schema import ChatCompletionRequest, parse_body


@dataclass(frozen=True)
class RouteCall:
    """What `KVRouteRequestRouter.choose_replicas` reads to route a direct request (the
    same fields as an `EngineRequest`, plus the id its end is reported under)."""

    route_id: str
    prompt_token_ids: list[int]
    block_hashes: list[bytes]
    max_tokens: int  # the output of all its sequences


class _Unroutable(Exception):
    """A body routed by load alone: its replica's API answers the client."""


class RouteCalls:
    """Client bodies to `RouteCall`s (None when the body cannot be routed by its prompt)."""

    def __init__(self, prompts: PromptBuilder, auth: TenantAuth, max_model_len: int,
                 limits: RequestLimits | None = None):
        self.prompts = prompts
        self.auth = auth
        self.max_model_len = max_model_len
        self.limits = RequestLimits() if limits is None else limits
        self.max_token_chars = longest_token_chars(
            prompts.tokenizer.get_vocab(with_added_tokens=True))

    def of(self, body: bytes, authorization: str | None) -> RouteCall | None:
        try:
            return self._call(body, authorization)
        except (_Unroutable, APIError, PromptError, ValueError, RecursionError, OverflowError):
            return None  # the replica's API answers the client with the 4xx

    def _call(self, body: bytes, authorization: str | None) -> RouteCall:
        tenant = self.auth.tenant_of(authorization)
        check_body_size(len(body), self.limits)
        check_json_depth(body, self.limits)
        data = json.loads(body)
        if not isinstance(data, dict):
            raise _Unroutable
        if "messages" in data:
            token_ids, per_sequence, total = self._chat(body, data)
        else:
            token_ids, per_sequence, total = self._completion(data)
        if not token_ids or len(token_ids) + per_sequence > self.max_model_len:
            raise _Unroutable  # the replica answers context_length_exceeded
        return RouteCall(uuid.uuid4().hex, token_ids,
                         self.prompts.block_hashes(token_ids, tenant), total)

    def _chat(self, body: bytes, data: dict[str, Any]) -> tuple[list[int], int, int]:
        output = output_tokens(data, self.limits, 1, self.max_model_len)
        chat = parse_body(body, ChatCompletionRequest, self.limits)
        messages = [{"role": m.role, "content": m.text()} for m in chat.messages]
        self._check_text(sum(len(m["content"]) for m in messages), "messages")
        return self.prompts.encode_chat(messages), output.per_sequence, output.total

    def _completion(self, data: dict[str, Any]) -> tuple[list[int], int, int]:
        """The prompt (a batch: its first one) read as the schema reads it."""
        prompt = data.get("prompt")
        num_prompts = 1
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            num_prompts = len(prompt)
            check_text_length(sum(len(p) for p in prompt if isinstance(p, str)), self.limits,
                              "prompt")
            longest = max((len(p) for p in prompt if isinstance(p, str)), default=0)
            check_text_fits(longest, self.max_model_len, self.max_token_chars, "prompt")
            prompt = prompt[0]  # a batch is routed on its first prompt
        output = output_tokens(data, self.limits, num_prompts, self.max_model_len)
        if isinstance(prompt, str) and prompt:
            self._check_text(len(prompt), "prompt")
            token_ids = self.prompts.encode_text(prompt)
        elif isinstance(prompt, list) and _token_ids(prompt, self.max_model_len):
            token_ids = prompt
        else:
            raise _Unroutable
        return token_ids, output.per_sequence, output.total

    def _check_text(self, num_chars: int, param: str) -> None:
        check_text_length(num_chars, self.limits, param)
        check_text_fits(num_chars, self.max_model_len, self.max_token_chars, param)


def _token_ids(values: list, max_model_len: int) -> bool:
    """A prompt of token ids that could fit the context, all uint32 (what a block hash
    takes; `type is int` leaves out bools), checked at C speed."""
    return (0 < len(values) <= max_model_len and set(map(type, values)) == {int}
            and min(values) >= 0 and max(values) < 2**32)
