"""vLLM's `/tokenize`, `/detokenize` and `/version`, in vLLM's shapes.

POST /tokenize takes a completion prompt (`prompt`, `add_special_tokens` default true) or
chat messages (`messages`, `add_generation_prompt` default true, `add_special_tokens`
default false: the template writes them) and answers `{"count", "max_model_len", "tokens"}`,
plus `"token_strs"` when `return_token_strs` is true. POST /detokenize takes `{"tokens"}`
and answers `{"prompt"}`. GET /version answers `{"version"}`, the installed kvroute
distribution's. `model` is optional in both bodies and checked when given.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)

from worker.openai.errors import APIError
from worker.openai.limits import RequestLimits, check_text_length, load_object
from worker.openai.prompt import PromptBuilder, PromptError
from worker.openai.schema import (
    MAX_MESSAGES,
    ChatMessage,
    check_list_length,
    parse_body,
    validate_body,
)

MAX_DETOKENIZE_TOKENS = 1 << 20


class TokenizeCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    prompt: StrictStr
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool = False


class TokenizeChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: StrictBool = True
    add_special_tokens: StrictBool = False
    return_token_strs: StrictBool = False

    @field_validator("messages", mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        return check_list_length(v, MAX_MESSAGES, "messages")


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    # a context's worth at most: 4M ids (what fits the body limit) took 2.4 s to decode
    tokens: list[StrictInt]

    @field_validator("tokens", mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        return check_list_length(v, MAX_DETOKENIZE_TOKENS, "token ids")


def kvroute_version() -> str:
    try:
        return version("kvroute")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def version_body() -> dict[str, str]:
    return {"version": kvroute_version()}


def tokenize(raw: bytes, prompts: PromptBuilder, check_model: Callable[[str | None], None],
             max_model_len_tokens: int, limits: RequestLimits) -> dict[str, Any]:
    body: TokenizeCompletionRequest | TokenizeChatRequest
    # size, nesting, values, JSON: an OpenAI error if bad (scanned and parsed once)
    data = load_object(raw, limits, max_model_len_tokens)
    chat = "messages" in data
    body = validate_body(data, TokenizeChatRequest if chat else TokenizeCompletionRequest,
                         limits)
    check_model(body.model)
    tokenizer = prompts.tokenizer
    if isinstance(body, TokenizeChatRequest):
        check_text_length(sum(len(m.text()) for m in body.messages), limits, "messages")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = prompts.render_chat(messages, body.add_generation_prompt)
        except PromptError as err:
            raise APIError(400, str(err), param="messages") from None
    else:
        check_text_length(len(body.prompt), limits, "prompt")
        text = body.prompt
    ids = tokenizer.encode(text, add_special_tokens=body.add_special_tokens).ids
    out: dict[str, Any] = {"count": len(ids), "max_model_len": max_model_len_tokens,
                           "tokens": ids}
    if body.return_token_strs:
        out["token_strs"] = [tokenizer.id_to_token(t) for t in ids]
    return out


def detokenize(raw: bytes, prompts: PromptBuilder, check_model: Callable[[str | None], None],
               limits: RequestLimits, max_model_len_tokens: int | None = None
               ) -> dict[str, Any]:
    body = parse_body(raw, DetokenizeRequest, limits, max_model_len_tokens)
    check_model(body.model)
    vocab_size = prompts.tokenizer.get_vocab_size(with_added_tokens=True)
    if any(not 0 <= t < vocab_size for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {vocab_size})", param="tokens",
                       code="invalid_value")
    return {"prompt": prompts.tokenizer.decode(body.tokens, skip_special_tokens=False)}
