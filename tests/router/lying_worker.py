"""A real HTTP worker that lies, for the external-workers tests: an aiohttp server on
127.0.0.1 in the test's own event loop. It passes the worker set's checks (/health,
/v1/models) and answers the rest as the test tells it: redirects, endless or huge bodies,
NaN gauges, requests that never finish. It records what reached it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class LyingWorker:
    def __init__(self, model: str = "tiny"):
        self.model = model
        self.metrics_text = ""  # GET /metrics answers this
        self.model_fields: dict = {}  # more fields of its /v1/models entry
        self.post: Handler | None = None  # POST /v1/* (and /tokenize) answers with this
        self.paths: list[str] = []  # every request's method and path, in order
        self.num_cancelled = 0  # POST handlers cancelled because the client left
        self.finished = asyncio.Event()  # set when a POST handler ends, however it ends
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> LyingWorker:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._any)
        # handler_cancellation: a client that disconnects cancels its handler, as vLLM
        # aborts a request whose connection closed
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list",
                                  "data": [{"id": self.model, **self.model_fields}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text, content_type="text/plain")

    async def _any(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(f"{request.method} {request.path}")
        if self.post is None:
            raise web.HTTPNotFound()
        try:
            return await self.post(request)
        except asyncio.CancelledError:
            self.num_cancelled += 1
            raise
        finally:
            self.finished.set()


def gauges(running: str, waiting: str) -> str:
    """vLLM's two queue gauges, with the values as written in the exposition."""
    return (f"# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="tiny"}} {running}\n'
            f"# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="tiny"}} {waiting}\n')
