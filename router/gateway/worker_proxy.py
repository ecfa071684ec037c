"""Forwards one OpenAI request to an external worker over HTTP and relays its answer as is.

The body goes out unchanged (or with the tenant's `cache_salt`) and the worker's bytes come
back unchanged: SSE events, usage and `cached_tokens` included. One keep-alive connection
pool serves every worker. The caller picks the worker (`pick`) and hears back once per pick
(`release`), with the error when the worker failed:

- the worker fails before anything reached the client (it cannot be reached, drops the
  connection, or answers 502/503/504): the request goes to another worker, up to
  `max_attempts` workers;
- it fails after the first bytes were relayed: the client gets an error event (OpenAI's
  error body as an SSE `data:` line) and the stream ends; nothing is replayed.

Any other answer of the worker (a 400 for bad input, a 404 for an unknown model) is the
client's answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
from fastapi.responses import Response, StreamingResponse

from router.cluster.worker_spec import WorkerSpec
from worker.openai.errors import APIError

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({502, 503, 504})  # the worker is closing, overloaded or lost
Pick = Callable[[frozenset[str]], WorkerSpec]  # workers tried so far -> the next one
Release = Callable[[str, "str | None"], None]  # worker id, error (None: it answered)


@dataclass(frozen=True)
class ProxyConfig:
    max_attempts: int = 3  # workers tried before the client gets a 503
    connect_timeout_s: float = 5.0
    # Between two reads from the worker; a prompt waiting in a long queue waits this long
    # for its first byte.
    read_timeout_s: float = 600.0
    max_connections: int = 1024  # to all workers together

    def __post_init__(self):
        if self.max_attempts < 1:
            raise ValueError(f"ProxyConfig: max_attempts must be >= 1, got {self.max_attempts}")
        for name in ("connect_timeout_s", "read_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ProxyConfig: {name} must be > 0, got {getattr(self, name)}")
        if self.max_connections < 1:
            raise ValueError("ProxyConfig: max_connections must be >= 1")


class WorkerFailed(Exception):
    """The worker failed before anything was relayed (the request may go elsewhere)."""


def worker_lost_event(worker_id: str, error: str) -> bytes:
    body = APIError(502, f"worker {worker_id} failed mid-response: {error}",
                    type_="server_error", code="worker_lost").body()
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class WorkerProxy:
    """One aiohttp session (keep-alive pool) to every worker. aiohttp, not httpx: a bare
    relay measured 1.6-1.9 ms over the direct path with it against 3.6-3.9 ms with httpx
    on the shared box (benchmarks/RESULTS.md, external workers)."""

    def __init__(self, config: ProxyConfig | None = None):
        self.config = config or ProxyConfig()
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on the event loop that uses it
            config = self.config
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=config.max_connections,
                                               limit_per_host=0,
                                               keepalive_timeout=_KEEPALIVE_S),
                timeout=aiohttp.ClientTimeout(total=None, connect=config.connect_timeout_s,
                                              sock_read=config.read_timeout_s),
                auto_decompress=False, skip_auto_headers=("User-Agent",))
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def forward(self, path: str, body: bytes, pick: Pick, release: Release) -> Response:
        """The worker's answer to POST `path` with `body` (JSON), from the first worker
        that answers; APIError(503) naming the last failure when none does."""
        tried: set[str] = set()
        last_error = "no worker was tried"
        for _ in range(self.config.max_attempts):
            worker = pick(frozenset(tried))  # raises APIError(503) when none is left
            tried.add(worker.worker_id)
            try:
                opened = await self._open(worker, path, body)
            except WorkerFailed as err:
                last_error = str(err)
                log.warning("request to %s failed before any reply: %s", worker.url, err)
                release(worker.worker_id, last_error)
                continue
            except BaseException:
                release(worker.worker_id, None)
                raise
            if isinstance(opened, Response):
                release(worker.worker_id, None)
                return opened
            response, first = opened
            return StreamingResponse(self._relay(worker, response, first, release),
                                     status_code=response.status,
                                     headers={"content-type": response.headers["Content-Type"]})
        raise APIError(503, f"no worker could serve the request after {len(tried)} "
                            f"attempt(s): {last_error}", type_="service_unavailable_error",
                       code="worker_unavailable")

    async def _open(self, worker: WorkerSpec, path: str, body: bytes
                    ) -> Response | tuple[aiohttp.ClientResponse, bytes]:
        """Sends the request. An event stream comes back open with its first chunk read,
        anything else read whole: nothing has reached the client yet, so a failure here
        may be retried elsewhere."""
        streaming = False
        response: aiohttp.ClientResponse | None = None
        try:
            response = await self._post(worker.url + path, body)
            if response.status in RETRY_STATUSES:
                text = (await response.read())[:300].decode(errors="replace")
                raise WorkerFailed(f"it answered {response.status}: {text}")
            if response.content_type != "text/event-stream":
                return Response(await response.read(), status_code=response.status,
                                media_type=response.headers.get("content-type"))
            first = await response.content.readany()
            streaming = True
            return response, first
        except _WORKER_ERRORS as err:
            raise WorkerFailed(_describe(err)) from None
        finally:
            if response is not None and not streaming:
                response.release()

    async def _post(self, url: str, body: bytes) -> aiohttp.ClientResponse:
        """POSTs on a pooled connection. One the worker closed as it went idle (its
        keep-alive timeout) fails before any answer: that is tried again, on another
        connection, rather than counted against the worker."""
        for attempt in range(_STALE_CONNECTION_RETRIES + 1):
            try:
                return await self._client().post(url, data=body, headers=_HEADERS)
            except aiohttp.ClientConnectorError:
                raise  # nothing listens: no retry here
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                if attempt == _STALE_CONNECTION_RETRIES:
                    raise
        raise AssertionError("unreachable")

    async def _relay(self, worker: WorkerSpec, response: aiohttp.ClientResponse,
                     first: bytes, release: Release) -> AsyncIterator[bytes]:
        error: str | None = None
        try:
            if first:
                yield first
            async for chunk in response.content.iter_any():
                yield chunk
        except _WORKER_ERRORS as err:
            error = _describe(err)
            log.warning("worker %s failed mid-response: %s", worker.url, error)
            yield worker_lost_event(worker.worker_id, error)
        finally:  # also when the client leaves: closing the connection aborts the request
            release(worker.worker_id, error)
            if error is None and response.content.at_eof():
                response.release()  # the connection goes back to the pool
            else:
                response.close()


_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
# Idle connections are dropped before the workers drop them (uvicorn's default keep-alive,
# which vLLM and `kvroute engine` use, is 5 s), so few stale ones are ever picked...
_KEEPALIVE_S = 4.0
# ...and a request that meets one anyway is sent again this many times.
_STALE_CONNECTION_RETRIES = 2
# The worker is gone, unreachable, or cut the answer short (a read timeout too).
_WORKER_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
