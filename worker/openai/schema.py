"""OpenAI request bodies, validated.

Unknown fields are ignored (clients send extras); known fields are checked for type and
range, and a parameter kvroute cannot honour (penalties, response_format, logit_bias,
tool_choice, best_of, echo, ...) is a 400 naming it rather than silently ignored. Every
failure becomes `APIError` (worker/openai/errors.py).

Every number is bounded and every list capped here, before anything is tokenized, routed or
sampled: a number is finite and of its own type (no strings, no booleans, no NaN or
Infinity, which Python's JSON parser accepts), and no field can carry a client-sized list
into the engine's per-step work. docs/parameters.md lists each bound.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from protocol.engine import MAX_LOGPROBS, MAX_STOP_TOKEN_IDS
from worker.openai.errors import APIError
from worker.openai.limits import (
    MAX_MESSAGES,
    MAX_STOP_STRINGS,
    RequestLimits,
    check_sequences,
    check_stops,
    check_text_length,
    load_object,
)

DEFAULT_LIMITS = RequestLimits()

DEFAULT_MAX_TOKENS = 16
# Output tokens one choice may ask for, before the context check: a bound every integer
# field downstream holds (the replica's context is the real limit; 400 over it).
MAX_OUTPUT_TOKENS = 2**31 - 1
INT64 = (-(2**63), 2**63 - 1)

# A finite JSON number (an integer is fine), never a string or a boolean.
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
TokenCount = Annotated[int, Field(strict=True, ge=1, le=MAX_OUTPUT_TOKENS)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    max_tokens: TokenCount | None = None
    temperature: Number = Field(default=1.0, ge=0, le=2)
    top_p: Number = Field(default=1.0, gt=0, le=1)
    # extensions (vLLM's): top_k 0 or -1 = off; min_p 0 = off
    top_k: StrictInt = Field(default=0, ge=-1, le=MAX_OUTPUT_TOKENS)
    min_p: Number = Field(default=0.0, ge=0, le=1)
    seed: StrictInt | None = Field(default=None, ge=INT64[0], le=INT64[1])
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # choices per prompt; n x prompts is capped by RequestLimits.max_sequences
    n: StrictInt = Field(default=1, ge=1)
    ignore_eos: StrictBool = False  # extension
    # extension (vLLM's), <= max_tokens
    min_tokens: StrictInt = Field(default=0, ge=0, le=MAX_OUTPUT_TOKENS)
    presence_penalty: Number = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: Number = Field(default=0.0, ge=-2, le=2)
    repetition_penalty: Number = Field(default=1.0, gt=0, le=2)  # extension (vLLM's)
    user: StrictStr | None = None
    # extension (vLLM's); each below the model's vocabulary size (the engine checks it)
    stop_token_ids: list[StrictInt] | None = None
    # OpenAI's and vLLM's parameters kvroute does not honour: a 400 naming the field unless
    # the value is the one that changes nothing (nothing is silently ignored).
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, Any] | None = None
    best_of: StrictInt | None = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None

    @field_validator("response_format", "logit_bias", "best_of", "tool_choice",
                     "parallel_tool_calls", "functions", "function_call")
    @classmethod
    def _not_honoured(cls, v: Any, info: Any) -> Any:
        harmless = {"response_format": ({"type": "text"},), "logit_bias": ({},),
                    "best_of": (1,), "tool_choice": ("none",)}.get(info.field_name, ())
        if v is not None and v not in harmless:
            raise ValueError(f"{info.field_name} is not supported")
        return v

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _token_id_count(cls, v: Any) -> Any:
        return check_list_length(v, MAX_STOP_TOKEN_IDS, "stop_token_ids")

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(not 0 <= t < 2**32 for t in v):
            raise ValueError("token ids must be in [0, 2**32)")
        return v

    @field_validator("presence_penalty", "frequency_penalty", "repetition_penalty")
    @classmethod
    def _unsupported_values(cls, v: Any, info: Any) -> Any:
        neutral = 1 if info.field_name == "repetition_penalty" else 0
        if v != neutral:
            raise ValueError(f"{info.field_name} is not supported (only {neutral})")
        return v

    @model_validator(mode="after")
    def _min_tokens_fit(self) -> _SamplingFields:
        max_tokens = self.output_tokens()
        if self.min_tokens > max_tokens:
            raise _FieldError("min_tokens", f"min_tokens ({self.min_tokens}) is larger "
                                            f"than the output tokens asked for ({max_tokens})")
        return self

    def output_tokens(self) -> int:
        """The output tokens asked for (OpenAI's default of 16 when unset)."""
        return self.max_tokens or DEFAULT_MAX_TOKENS

    def top_logprobs_count(self) -> int | None:
        """Alternatives per token for the engine: None when no logprobs were asked for."""
        raise NotImplementedError

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_count(cls, v: Any) -> Any:
        return check_list_length(v, MAX_STOP_STRINGS, "stop sequences")

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty")
        return v

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingFields):
    # one prompt (text or token ids) or a batch of them (all text or all token ids)
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    echo: StrictBool = False
    suffix: StrictStr | None = None
    # the sampled token's and this many most likely tokens' log-probabilities (0 to 20)
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    top_logprobs: Any = None  # chat's parameter: refused here, so it is not ignored

    @field_validator("top_logprobs")
    @classmethod
    def _chat_only(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError("top_logprobs is a chat parameter; completions take logprobs "
                             "(an integer) instead")
        return v

    # check_prompt checks every type and range the annotation states, at C speed; pydantic's
    # own pass over the union (4M token ids: ~100 ms more) is skipped: `handler` not called
    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompts(cls, v: Any, handler: Any) -> Any:
        check_prompt(v)
        return v

    def prompts(self) -> list[str | list[int]]:
        """The batch: one entry per prompt, in the request's order."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)

    def top_logprobs_count(self) -> int | None:
        return self.logprobs

    @field_validator("echo", "suffix")
    @classmethod
    def _unsupported(cls, v: Any, info: Any) -> Any:
        if v:
            raise ValueError(f"{info.field_name} is not supported")
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: TokenCount | None = None
    tools: list[Any] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @field_validator("messages", mode="before")
    @classmethod
    def _message_count(cls, v: Any) -> Any:
        return check_list_length(v, MAX_MESSAGES, "messages")

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise _FieldError("top_logprobs", "top_logprobs needs logprobs: true")
        return self

    def top_logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def output_tokens(self) -> int:
        return self.max_new_tokens() or DEFAULT_MAX_TOKENS

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, v: list[Any] | None) -> list[Any] | None:
        if v:
            raise ValueError("tools are not supported")
        return v

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class _FieldError(ValueError):
    """A check across fields that names the one to blame (parse_body's `param`)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def check_list_length(v: Any, cap: int, what: str) -> Any:
    """`v`, or ValueError when it is a list of more than `cap` items: checked before its
    items are validated (pydantic's max_length is checked after validating them all, and
    3.9M stop token ids took a second)."""
    if isinstance(v, list) and len(v) > cap:
        raise ValueError(f"at most {cap} {what}, got {len(v)}")
    return v


_TOKEN_IDS = list[Annotated[int, msgspec.Meta(ge=0, lt=2**32)]]


def are_token_ids(values: Any) -> bool:
    """`values` is a non-empty list of uint32 JSON integers (not bools, not floats): one C
    pass (msgspec), ~10 ms a million ids against ~60 for type, min and max passes; a prompt
    may hold a context's worth, and a batch 8 MiB of them."""
    if not isinstance(values, list) or not values:
        return False
    try:
        msgspec.convert(values, _TOKEN_IDS)
    except msgspec.ValidationError:
        return False
    return True


def check_prompt(v: Any) -> None:
    """A completion prompt: a non-empty string, non-empty token ids, or a non-empty list of
    either (not both). ValueError naming what is wrong."""
    if are_token_ids(v) or (isinstance(v, list) and v and type(v[0]) is list
                            and all(map(are_token_ids, v))):
        return  # token ids, or a batch of them: the common large prompts, at C speed
    if isinstance(v, str):
        if not v:
            raise ValueError("the prompt is empty")
        return
    if not isinstance(v, list) or not v:
        raise ValueError("the prompt must be a non-empty string, a list of token ids, or a "
                         "non-empty list of strings or of token id lists")
    kinds = set(map(type, v))  # at C speed: a prompt may hold a context's worth of ids
    if kinds == {int}:
        _check_ids(v, "the prompt")
    elif kinds == {str}:
        if not all(v):
            raise ValueError(f"prompt {[bool(p) for p in v].index(False)} of the batch is "
                             "empty")
    elif kinds == {list}:
        for i, ids in enumerate(v):
            if not ids or set(map(type, ids)) != {int}:
                raise ValueError(f"prompt {i} of the batch must be a non-empty list of "
                                 "token ids")
            _check_ids(ids, f"prompt {i} of the batch")
    else:
        raise ValueError("a batch of prompts must be all strings or all token id lists, "
                         "not a mix")


def _check_ids(ids: list[int], what: str) -> None:
    if min(ids) < 0 or max(ids) >= 2**32:
        raise ValueError(f"{what}: token ids must be in [0, 2**32)")


# pydantic names the member of a union an error came from ("stop.str"); the client's
# parameter has no such part
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|list|dict)(\[.*\])?$")


def _param_of(loc: tuple[str | int, ...]) -> str | None:
    return ".".join(str(p) for p in loc
                    if not (isinstance(p, str) and _UNION_MEMBER.match(p))) or None


def parse_body(raw: bytes, model_cls: type[BaseModel],
               limits: RequestLimits = DEFAULT_LIMITS,
               max_model_len_tokens: int | None = None) -> Any:
    """The body as `model_cls`, or APIError (413 too large, else 400 naming the first bad
    parameter). Size, nesting and the values it holds (with the context length when known:
    what a batch of token ids may hold) are checked before parsing, text length before
    anyone tokenizes it (worker/openai/limits.py)."""
    return validate_body(load_object(raw, limits, max_model_len_tokens), model_cls, limits)


def validate_body(data: dict[str, Any], model_cls: type[BaseModel],
                  limits: RequestLimits = DEFAULT_LIMITS) -> Any:
    """`data` (a body `load_object` read) as `model_cls`, or APIError (400 naming the first
    bad parameter); text length is checked before anyone tokenizes it."""
    try:
        body = model_cls.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        param = _param_of(first["loc"])
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, _FieldError):
            param = cause.param
        if first["type"] == "missing":
            message = f"missing required parameter: {param!r}"
            code = "missing_required_parameter"
        else:
            detail = first["msg"].removeprefix("Value error, ")
            message = f"invalid value for {param!r}: {detail}"
            code = "invalid_value"
        raise APIError(400, message, param=param, code=code) from None
    _check_limits(body, limits)
    return body


def _check_limits(body: BaseModel, limits: RequestLimits) -> None:
    if isinstance(body, CompletionRequest):
        prompts = body.prompts()
        check_text_length(sum(len(p) for p in prompts if isinstance(p, str)), limits,
                          "prompt")
        check_sequences(len(prompts), body.n, limits)
    elif isinstance(body, ChatCompletionRequest):
        check_text_length(sum(len(m.text()) for m in body.messages), limits, "messages")
        check_sequences(1, body.n, limits)
    if isinstance(body, _SamplingFields):
        check_stops(body.stop_strings(), limits)
