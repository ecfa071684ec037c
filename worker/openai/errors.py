"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a status."""

from __future__ import annotations

from typing import Any

from protocol.engine import EngineInputError


class APIError(Exception):
    """An error answered with an OpenAI-style body."""

    def __init__(self, status_code: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers: dict[str, str] | None = None  # e.g. Retry-After on a 429

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def engine_input_error(err: EngineInputError) -> APIError:
    """A request the engine refused as asked: 400, naming a context overflow as OpenAI does."""
    message = str(err.args[0]) if err.args else str(err)
    code = "context_length_exceeded" if "context" in message else "invalid_request"
    return APIError(400, message, code=code)
