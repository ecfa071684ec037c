"""Buckets for py-spy stacks: where the code that was on CPU lives, by its leaf frame."""

from __future__ import annotations

import re

# (start of a path component run in the leaf frame's file, bucket), first match wins;
# py-spy names files relative to their sys.path entry ("ray/serve/...", "router/...")
_BUCKETS: tuple[tuple[str, str], ...] = (
    ("ray/serve/_private/proxy", "Serve proxy"),
    ("ray/serve/_private/replica", "Serve replica (request handling)"),
    ("ray/serve/_private/router", "Serve handle + request routing"),
    ("ray/serve/_private/request_router", "Serve handle + request routing"),
    ("ray/serve/handle", "Serve handle + request routing"),
    ("ray/serve/", "Serve other"),
    ("ray/", "Ray core (calls, streaming, serialization)"),
    ("uvicorn/", "HTTP server (uvicorn, h11/httptools)"),
    ("h11/", "HTTP server (uvicorn, h11/httptools)"),
    ("httptools/", "HTTP server (uvicorn, h11/httptools)"),
    ("starlette/", "ASGI (Starlette, FastAPI, anyio)"),
    ("fastapi/", "ASGI (Starlette, FastAPI, anyio)"),
    ("anyio/", "ASGI (Starlette, FastAPI, anyio)"),
    ("pydantic", "pydantic"),
    ("asyncio/", "asyncio event loop"),
    ("json/", "json"),
    ("pickle", "pickle"),
    ("grpc/", "gRPC"),
    ("prometheus_client/", "prometheus_client"),
    ("router/gateway/", "kvroute gateway"),
    ("router/", "kvroute router (core, serve, cluster)"),
    ("worker/openai", "kvroute OpenAI layer (worker/openai*)"),
    ("worker/", "kvroute engine (worker/)"),
    ("kv/", "kvroute kv/"),
    ("logging/", "logging"),
    ("concurrent/futures/", "thread pools"),
    ("threading.py", "threads"),
)

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def frame_file(frame: str) -> str:
    """`func (short/path.py)` of a py-spy frame `func (/long/path.py:line)`."""
    m = _FRAME.match(frame)
    if m is None:
        return frame
    path = m["file"]
    for marker in ("site-packages/", "/python3.11/", "wt-overhead/", "/work/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m['func']} ({path})"


def bucket_of(stack: str) -> str:
    """The bucket of a `;`-joined stack's leaf frame."""
    leaf = stack.rsplit(";", 1)[-1]
    m = _FRAME.match(leaf)
    path = m["file"] if m is not None else leaf
    path = "/" + path
    for marker, name in _BUCKETS:
        if "/" + marker in path:
            return name
    return "other"
