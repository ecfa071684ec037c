"""Every error of an OpenAI-compatible app (FastAPI or plain Starlette) as an OpenAI error
body."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException

from worker.openai.errors import APIError


async def _api_error(request: Request, err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status_code, headers=err.headers)


async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
    return JSONResponse(APIError(err.status_code, str(err.detail), code=code).body(),
                        status_code=err.status_code)


async def _validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
    return JSONResponse(APIError(400, f"invalid request: {err.errors()[:1]}").body(),
                        status_code=400)


def install_error_handlers(app: Starlette) -> None:
    """APIError as raised; unknown routes and methods (404, 405) and FastAPI's own
    validation errors (400) in the same shape."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
