"""OpenAI request bodies, validated.

Unknown fields are ignored (clients send extras); known fields are checked for type and
range, and a parameter kvroute cannot honour (n > 1, logprobs, penalties, response_format,
logit_bias, tool_choice, best_of, min_tokens, ...) is a 400 naming it rather than silently
ignored. Every failure becomes `APIError` (worker/openai/errors.py).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from worker.openai.errors import APIError
from worker.openai.limits import (
    RequestLimits,
    check_body_size,
    check_json_depth,
    check_stops,
    check_text_length,
)

DEFAULT_LIMITS = RequestLimits()

DEFAULT_MAX_TOKENS = 16

Number = Annotated[float, Field(allow_inf_nan=False)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: Number = Field(default=1.0, ge=0, le=2)
    top_p: Number = Field(default=1.0, gt=0, le=1)
    top_k: StrictInt = Field(default=0, ge=0)  # extension (vLLM's): 0 = off
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(default=1, ge=1)
    ignore_eos: StrictBool = False  # extension
    presence_penalty: Number = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: Number = Field(default=0.0, ge=-2, le=2)
    logprobs: StrictBool | StrictInt | None = None
    user: StrictStr | None = None
    stop_token_ids: list[StrictInt] | None = None  # extension (vLLM's)
    # OpenAI's and vLLM's parameters kvroute does not honour: a 400 naming the field unless
    # the value is the one that changes nothing (nothing is silently ignored).
    top_logprobs: StrictInt | None = None
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, Any] | None = None
    min_tokens: StrictInt | None = None
    best_of: StrictInt | None = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None

    @field_validator("top_logprobs", "response_format", "logit_bias", "min_tokens",
                     "best_of", "tool_choice", "parallel_tool_calls", "functions",
                     "function_call")
    @classmethod
    def _not_honoured(cls, v: Any, info: Any) -> Any:
        harmless = {"top_logprobs": (0,), "response_format": ({"type": "text"},),
                    "logit_bias": ({},), "min_tokens": (0,), "best_of": (1,),
                    "tool_choice": ("none",)}.get(info.field_name, ())
        if v is not None and v not in harmless:
            raise ValueError(f"{info.field_name} is not supported")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(not 0 <= t < 2**32 for t in v):
            raise ValueError("token ids must be in [0, 2**32)")
        return v

    @field_validator("n", "presence_penalty", "frequency_penalty", "logprobs")
    @classmethod
    def _unsupported_values(cls, v: Any, info: Any) -> Any:
        default = {"n": 1}.get(info.field_name, 0)
        if v is not None and v is not False and v != default:
            raise ValueError(f"{info.field_name} is not supported (only {default!r})")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty")
        return v

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingFields):
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    echo: StrictBool = False
    suffix: StrictStr | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> str | list[int]:
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError("batched prompts are not supported; send one prompt")
            v = v[0]
        if isinstance(v, list) and any(not 0 <= t < 2**32 for t in v):
            raise ValueError("token ids must be in [0, 2**32)")
        if len(v) == 0:
            raise ValueError("the prompt is empty")
        return v

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
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    tools: list[Any] | None = None

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, v: list[Any] | None) -> list[Any] | None:
        if v:
            raise ValueError("tools are not supported")
        return v

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def parse_body(raw: bytes, model_cls: type[BaseModel],
               limits: RequestLimits = DEFAULT_LIMITS) -> Any:
    """The body as `model_cls`, or APIError (413 too large, else 400 naming the first bad
    parameter). Size and nesting are checked before parsing, text length before anyone
    tokenizes it (worker/openai/limits.py)."""
    check_body_size(len(raw), limits)
    check_json_depth(raw, limits)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise APIError(400, f"the request body is not valid JSON: {err}",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        body = model_cls.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "missing":
            message = f"missing required parameter: {param!r}"
            code = "missing_required_parameter"
        else:
            detail = first["msg"].removeprefix("Value error, ")
            message = f"invalid value for {param!r}: {detail}"
            code = "invalid_value"
        raise APIError(400, message, param=param, code=code) from None
    _check_text(body, limits)
    return body


def _check_text(body: BaseModel, limits: RequestLimits) -> None:
    if isinstance(body, CompletionRequest) and isinstance(body.prompt, str):
        check_text_length(len(body.prompt), limits, "prompt")
    elif isinstance(body, ChatCompletionRequest):
        check_text_length(sum(len(m.text()) for m in body.messages), limits, "messages")
    if isinstance(body, _SamplingFields):
        check_stops(body.stop_strings(), limits)
