"""The worker gateway's HTTP app: its routes, OpenAI-style error bodies, request counts.

A plain Starlette app (no FastAPI request parsing in the token path): every handler takes
the request and answers a Response; errors become OpenAI error bodies.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from router.gateway.metrics import GatewayMetrics
from router.gateway.worker_gateway import WorkerGateway
from worker.openai.errors import APIError
from worker.openai.latency import mark_arrival


async def _api_error(request: Request, err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status_code, headers=err.headers)


async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
    return JSONResponse(APIError(err.status_code, str(err.detail), code=code).body(),
                        status_code=err.status_code)


def create_app(gateway: WorkerGateway):
    """The gateway's routes, wrapped in its request counter (an ASGI app)."""
    g = gateway
    routes = [
        Route("/v1/completions", g.completions, methods=["POST"]),
        Route("/v1/chat/completions", g.chat_completions, methods=["POST"]),
        Route("/v1/models", g.models, methods=["GET"]),
        Route("/tokenize", g.tokenizer_call, methods=["POST"]),
        Route("/detokenize", g.tokenizer_call, methods=["POST"]),
        Route("/version", g.version, methods=["GET"]),
        Route("/v1/workers", g.list_workers, methods=["GET"]),
        Route("/v1/workers", g.add_worker, methods=["POST"]),
        Route("/v1/workers", g.remove_worker, methods=["DELETE"]),
        Route("/health", g.health, methods=["GET"]),
        Route("/ready", g.ready, methods=["GET"]),
        Route("/metrics", g.metrics_endpoint, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={APIError: _api_error,
                                                       HTTPException: _http_error})
    return _CountRequests(app, gateway.metrics)


class _CountRequests:
    """Counts responses by endpoint and status: a plain ASGI wrapper, which (unlike
    Starlette's BaseHTTPMiddleware) adds no task or queue to a streamed response."""

    def __init__(self, app, metrics: GatewayMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        mark_arrival(scope)

        async def send_counted(message):
            if message["type"] == "http.response.start":
                self.metrics.observe(scope["path"], message["status"])
            await send(message)

        await self.app(scope, receive, send_counted)
