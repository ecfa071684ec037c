"""What the ingress request router reads of a client's body to route it: the tenant from the
API key, then what the routers' one body reader reads (router/front/routing_body.py: the
prompt's token ids, chat template included, and the output it asks for, every number
bounded first) and the ids' Protocol 1 block hashes.

A body the replica will refuse (a bad or unbounded n or max_tokens, a prompt that cannot fit
the context, token ids out of range, a body the engine's schema refuses) is not routed on
its prompt, so it charges no replica, and the replica it goes to answers the client's 4xx.
Text is measured before it is tokenized: a prompt with more characters than the context can
hold is refused without tokenizing it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from router.front.routing_body import Context, load_json, read_chat, read_completion
from worker.openai.errors import APIError
from worker.openai.front import Auth
from worker.openai.limits import RequestLimits, longest_token_chars
from worker.openai.prompt import PromptBuilder, PromptError
from worker.openai.schema import ChatCompletionRequest, validate_body


@dataclass(frozen=True)
class RouteCall:
    """What `ServeRequestRouter.choose_replicas` reads to route a direct request (the
    same fields as an `EngineRequest`, plus the id its end is reported under)."""

    route_id: str
    prompt_token_ids: list[int]
    block_hashes: list[bytes]
    max_tokens: int  # the output of all its sequences
    num_sequences: int = 1  # n x the prompts of a batch: each is charged


class RouteCalls:
    """Client bodies to `RouteCall`s (None when the body cannot be routed by its prompt)."""

    def __init__(self, prompts: PromptBuilder, auth: Auth, max_model_len: int,
                 limits: RequestLimits | None = None):
        self.prompts = prompts
        self.auth = auth
        self.max_model_len = max_model_len
        self.limits = RequestLimits() if limits is None else limits
        self.context = Context(max_model_len, longest_token_chars(
            prompts.tokenizer.get_vocab(with_added_tokens=True)))

    def of(self, body: bytes, authorization: str | None) -> RouteCall | None:
        try:
            return self._call(body, authorization)
        except (APIError, PromptError, ValueError, RecursionError, OverflowError):
            return None  # the replica's API answers the client with the 4xx

    def _call(self, body: bytes, authorization: str | None) -> RouteCall:
        tenant = self.auth.tenant_of(authorization)
        data = load_json(body, self.limits, self.max_model_len)  # the one scan and parse
        if "messages" in data:
            # routed only when the engine's schema takes it: the replica runs it then
            validate_body(data, ChatCompletionRequest, self.limits)
            read = read_chat(data, self.prompts, self.limits, self.context)
        else:
            read = read_completion(data, self.prompts, self.limits, self.context)
        return RouteCall(uuid.uuid4().hex, read.token_ids,
                         self.prompts.block_hashes(read.token_ids, tenant), read.output.total,
                         read.output.num_sequences)
