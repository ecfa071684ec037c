"""The floor of a Python HTTP hop: a pass-through proxy on the worker gateway's own stack
(uvicorn with httptools, a plain Starlette route, aiohttp to the workers, round robin) that
does nothing else: no tokenizing, hashing, routing or metrics.

    python -m benchmarks.simlib.floor_proxy PORT WORKER_URL [WORKER_URL ...]

Prints "ready" once it listens. What the worker gateway adds over this is kvroute's own work.
"""

from __future__ import annotations

import itertools
import sys

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def create_app(worker_urls: list[str]) -> Starlette:
    targets = itertools.cycle(worker_urls)
    session: aiohttp.ClientSession | None = None

    async def forward(request: Request) -> Response:
        nonlocal session
        if session is None:
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        body = await request.body()
        resp = await session.post(next(targets) + request.url.path, data=body,
                                  headers={"Content-Type": "application/json"})
        if resp.content_type != "text/event-stream":
            data = await resp.read()
            resp.release()
            return Response(data, status_code=resp.status, media_type=resp.content_type)

        async def relay():
            try:
                async for chunk in resp.content.iter_any():
                    yield chunk
            finally:
                resp.release()

        return StreamingResponse(relay(), status_code=resp.status,
                                 media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", forward, methods=["POST"])])


def main() -> None:
    port, urls = int(sys.argv[1]), sys.argv[2:]
    config = uvicorn.Config(create_app(urls), host="127.0.0.1", port=port, http="httptools",
                            lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    print("ready", flush=True)  # uvicorn binds before it serves the first request
    server.run()


if __name__ == "__main__":
    main()
