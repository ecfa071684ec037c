"""The route table of every kvroute OpenAI server, and the app it makes.

One table, composed by the four fronts (worker/openai/front.py): the same paths, the same
auth, the same /v1/models, /tokenize, /detokenize, /version and /health bodies, the same
OpenAI error bodies for a bad route or method. Each front hands in what is its own: the
generation endpoints, /ready, /metrics, and extra routes (pins, the worker admin API).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as StarletteRoute

from worker.openai.front import FrontDoor
from worker.openai.http_errors import install_error_handlers
from worker.openai.openapi_body import request_body
from worker.openai.schema import ChatCompletionRequest, CompletionRequest
from worker.openai.tokenize import (
    DetokenizeRequest,
    TokenizeCompletionRequest,
    detokenize,
    tokenize,
    version_body,
)

Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    endpoint: Handler
    body: type[BaseModel] | None = None  # the JSON body, for the OpenAPI document


@dataclass(frozen=True)
class OwnRoutes:
    """What a front answers itself. `health`, `tokenize` and `detokenize` default to the
    front door's (200 `{"status": "ok"}`; the door's tokenizer)."""

    completions: Handler
    chat_completions: Handler
    ready: Handler
    metrics: Handler
    health: Handler | None = None
    tokenize: Handler | None = None
    detokenize: Handler | None = None
    extra: tuple[Route, ...] = ()


def route_table(door: FrontDoor, own: OwnRoutes) -> list[Route]:
    async def models(request: Request) -> Response:
        door.tenant(request)
        return JSONResponse(await door.models_body())

    async def tokenize_endpoint(request: Request) -> Response:
        door.tenant(request)
        return JSONResponse(tokenize(await door.body(request), door.prompts, door.check_model,
                                     await door.context(), door.limits))

    async def detokenize_endpoint(request: Request) -> Response:
        door.tenant(request)
        return JSONResponse(detokenize(await door.body(request), door.prompts,
                                       door.check_model, door.limits,
                                       await door.known_context()))

    async def version(request: Request) -> Response:
        return JSONResponse(version_body())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return [
        Route("POST", "/v1/completions", own.completions, CompletionRequest),
        Route("POST", "/v1/chat/completions", own.chat_completions, ChatCompletionRequest),
        Route("GET", "/v1/models", models),
        Route("POST", "/tokenize", own.tokenize or tokenize_endpoint,
              TokenizeCompletionRequest),
        Route("POST", "/detokenize", own.detokenize or detokenize_endpoint, DetokenizeRequest),
        Route("GET", "/version", version),
        Route("GET", "/health", own.health or health),
        Route("GET", "/ready", own.ready),
        Route("GET", "/metrics", own.metrics),
        *own.extra,
    ]


def build_app(routes: Sequence[Route], *, title: str, lifespan: Any = None,
              openapi: bool = False, plain: bool = False) -> Starlette:
    """An ASGI app serving `routes`, every error an OpenAI error body.

    `openapi`: serve /openapi.json, with the request bodies declared (a fuzzer reads it).
    `plain`: a Starlette app (no FastAPI endpoint wrapper in the token path: the handlers
    read their requests themselves anyway)."""
    if plain:
        app: Starlette = Starlette(lifespan=lifespan)
    else:
        app = FastAPI(title=title, docs_url=None, redoc_url=None,
                      openapi_url="/openapi.json" if openapi else None, lifespan=lifespan)
    install_error_handlers(app)
    for route in routes:
        if isinstance(app, FastAPI):
            app.add_api_route(route.path, _request_only(route.endpoint),
                              methods=[route.method], openapi_extra=_openapi(route))
        else:
            app.router.routes.append(StarletteRoute(route.path, route.endpoint,
                                                    methods=[route.method]))
    return app


def _request_only(endpoint: Handler) -> Handler:
    """`endpoint` with the one signature FastAPI passes the bare request to, whatever the
    handler's own annotations say (an unannotated parameter would be a query parameter)."""
    async def call(request: Request) -> Response:
        return await endpoint(request)

    return call


def _openapi(route: Route) -> dict[str, Any] | None:
    """What FastAPI cannot infer from a handler that reads its request itself: the body
    and the path's parameters (the handlers take only the request)."""
    extra: dict[str, Any] = {}
    if route.body is not None:
        extra.update(request_body(route.body))
    names = re.findall(r"{(\w+)}", route.path)
    if names:
        extra["parameters"] = [{"name": name, "in": "path", "required": True,
                                "schema": {"type": "string"}} for name in names]
    return extra or None
