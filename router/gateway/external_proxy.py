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
client's answer (released as `refused` when it is a 4xx: the worker ran nothing), within
bounds that a lying or broken worker cannot cross:

- redirects are never followed (a 307 would re-POST the tenant's prompt and salt to any
  address, a 302 fetch any internal URL for the client): a 3xx is a 502 `worker_redirect`;
- an answer that is neither JSON nor an event stream is a 502 `worker_bad_response`, and
  a 5xx other than 502/503/504 (the worker's own failure) a 502 `worker_error`;
- at most `max_response_bytes` of an answer are read (more: a 502), and a stream is cut
  with an error event at `max_event_bytes` in one event or `max_stream_bytes` in all;
- what reaches the client about a failure names no worker and quotes none of its text
  (that goes to the log, with the worker's URL).

Such an answer is released as a `violation` (the caller stops routing to that worker for a
while) and, as nothing reached the client yet, the request is tried once more on another
worker; the client gets the 502 only when that one fails too, or no other worker is left.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from fastapi.responses import Response, StreamingResponse

from router.cluster.external_worker_spec import WorkerSpec
from router.gateway.output_tokens import AnswerUsage, StreamTokens, answer_usage
from worker.openai.errors import APIError

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({502, 503, 504})  # the worker is closing, overloaded or lost
Pick = Callable[[frozenset[str]], WorkerSpec]  # workers tried so far -> the next one


class Release(Protocol):
    def __call__(self, worker_id: str, error: str | None, *, refused: bool = False,
                 violation: bool = False, output_tokens: int | None = None,
                 usage: AnswerUsage | None = None) -> None:
        """Once per pick: `error` when the worker failed (None: it answered), `violation`
        when its answer broke the protocol, `refused` when it answered a 4xx (ran
        nothing); `output_tokens`, the tokens its answer says it produced, when it says;
        `usage`, its answer's usage counts (prompt and cached tokens), when it ran."""


@dataclass(frozen=True)
class ProxyConfig:
    max_attempts: int = 3  # workers tried before the client gets a 503
    connect_timeout_s: float = 5.0
    # Between two reads from the worker; a prompt waiting in a long queue waits this long
    # for its first byte.
    read_timeout_s: float = 600.0
    max_connections: int = 1024  # to all workers together
    # An answer read whole (not a stream): 128 choices x 4,096 tokens with logprobs fit.
    max_response_bytes: int = 64 << 20
    max_event_bytes: int = 4 << 20  # one SSE event of a stream (a chunk is ~0.3 KiB)
    max_stream_bytes: int = 1 << 30  # a whole stream

    def __post_init__(self):
        if self.max_attempts < 1:
            raise ValueError(f"ProxyConfig: max_attempts must be >= 1, got {self.max_attempts}")
        for name in ("connect_timeout_s", "read_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ProxyConfig: {name} must be > 0, got {getattr(self, name)}")
        if self.max_connections < 1:
            raise ValueError("ProxyConfig: max_connections must be >= 1")
        for name in ("max_response_bytes", "max_event_bytes", "max_stream_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"ProxyConfig: {name} must be >= 1, got "
                                 f"{getattr(self, name)}")


class WorkerFailed(Exception):
    """The worker failed before anything was relayed (the request may go elsewhere)."""


class BadWorker(APIError):
    """A 502 for an answer kvroute will not relay: `message` (logged, and the worker's
    release error) may quote the worker; the client reads `public` only."""

    def __init__(self, message: str, code: str, public: str | None = None):
        super().__init__(502, public or message, type_="server_error", code=code)
        self.detail = message


def bad_worker(message: str, code: str, public: str | None = None) -> BadWorker:
    return BadWorker(message, code, public)


def error_event(err: APIError) -> bytes:
    return b"data: " + json.dumps(err.body(), separators=(",", ":")).encode() + b"\n\n"


WORKER_LOST = bad_worker("the worker serving this request failed mid-response",
                         "worker_lost")
STREAM_TOO_LARGE = bad_worker("the worker's stream was cut: an event or the whole stream "
                              "was larger than the gateway relays", "worker_response_too_large")


class ExternalProxy:
    """One aiohttp session (keep-alive pool) to every worker. aiohttp, not httpx: a bare
    relay measured 1.6-1.9 ms over the direct path with it against 3.6-3.9 ms with httpx
    on the shared box (benchmarks/NOTEBOOK.md, "External workers")."""

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
        that answers; APIError(503) when none does (the failures are logged), APIError(502)
        when one answers what is not relayed."""
        tried: set[str] = set()
        last_error = "no worker was tried"
        bad: BadWorker | None = None  # a worker's answer broke the protocol
        for _ in range(self.config.max_attempts):
            try:
                worker = pick(frozenset(tried))  # raises APIError(503) when none is left
            except APIError:
                if bad is not None:
                    raise bad from None
                raise
            tried.add(worker.worker_id)
            try:
                opened = await self._open(worker, path, body)
            except WorkerFailed as err:
                last_error = str(err)
                log.warning("request to %s failed before any reply: %s", worker.url, err)
                release(worker.worker_id, last_error)
                continue
            except BadWorker as err:  # a lying or failing worker: its answer is not relayed
                log.warning("worker %s: %s", worker.url, err.detail)
                release(worker.worker_id, err.detail, violation=True)
                if bad is not None:  # tried once more already
                    raise
                bad = err
                continue
            except BaseException:
                release(worker.worker_id, None)
                raise
            if isinstance(opened, Response):
                if 400 <= opened.status_code < 500:
                    release(worker.worker_id, None, refused=True)
                else:
                    usage = answer_usage(opened.body)
                    release(worker.worker_id, None, output_tokens=usage.completion_tokens,
                            usage=usage)
                return opened
            response, first = opened
            return StreamingResponse(self._relay(worker, response, first, release),
                                     status_code=response.status,
                                     media_type="text/event-stream")
        if bad is not None:
            raise bad
        log.warning("no worker could serve the request after %d attempt(s); the last: %s",
                    len(tried), last_error)
        raise APIError(503, f"no worker could serve the request after {len(tried)} "
                            f"attempt(s)", type_="service_unavailable_error",
                       code="worker_unavailable")

    async def _open(self, worker: WorkerSpec, path: str, body: bytes
                    ) -> Response | tuple[aiohttp.ClientResponse, bytes]:
        """Sends the request. An event stream comes back open with its first chunk read,
        a JSON answer read whole (up to `max_response_bytes`): nothing has reached the
        client yet, so a failure here may be retried elsewhere. Raises APIError(502) for
        an answer that is not relayed (a redirect, not JSON, too large)."""
        streaming = False
        response: aiohttp.ClientResponse | None = None
        try:
            response = await self._post(worker.url + path, body)
            if response.status in RETRY_STATUSES:
                text = (await response.content.read(300)).decode(errors="replace")
                raise WorkerFailed(f"it answered {response.status}: {text!r}")
            if response.status >= 500:  # its own failure: its text may be a traceback
                text = (await response.content.read(300)).decode(errors="replace")
                raise bad_worker(f"the worker failed (HTTP {response.status}): {text!r}",
                                 "worker_error", public="the worker failed to answer")
            if 300 <= response.status < 400:
                raise bad_worker(f"the worker answered a redirect ({response.status}); "
                                 f"the gateway follows none", "worker_redirect")
            if response.content_type == "application/json":
                return Response(await self._read_capped(response), status_code=response.status,
                                media_type="application/json")
            if response.content_type != "text/event-stream":
                raise bad_worker(f"the worker answered {response.status} with a "
                                 f"{response.content_type} body, not JSON",
                                 "worker_bad_response")
            first = await response.content.readany()
            streaming = True
            return response, first
        except _WORKER_ERRORS as err:
            raise WorkerFailed(_describe(err)) from None
        finally:
            if response is not None and not streaming:
                response.release()

    async def _read_capped(self, response: aiohttp.ClientResponse) -> bytes:
        cap = self.config.max_response_bytes
        if (response.content_length or 0) > cap:
            raise _too_large(cap)
        body = bytearray()
        while chunk := await response.content.read(1 << 16):
            body += chunk
            if len(body) > cap:
                raise _too_large(cap)
        return bytes(body)

    async def _post(self, url: str, body: bytes) -> aiohttp.ClientResponse:
        """POSTs on a pooled connection. One the worker closed as it went idle (its
        keep-alive timeout) fails before any answer: that is tried again, on another
        connection, rather than counted against the worker."""
        for attempt in range(_STALE_CONNECTION_RETRIES + 1):
            try:
                return await self._client().post(url, data=body, headers=_HEADERS,
                                                  allow_redirects=False)
            except aiohttp.ClientConnectorError:
                raise  # nothing listens: no retry here
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                if attempt == _STALE_CONNECTION_RETRIES:
                    raise
        raise AssertionError("unreachable")

    async def _relay(self, worker: WorkerSpec, response: aiohttp.ClientResponse,
                     first: bytes, release: Release) -> AsyncIterator[bytes]:
        error: str | None = None
        violation = False
        framer = _EventFramer(self.config)
        produced = StreamTokens()
        try:
            chunk = first
            while chunk:
                events = framer.feed(chunk)
                if events:
                    produced.feed(events)
                    yield events
                if framer.exceeded:
                    error = (f"its stream passed {self.config.max_event_bytes} bytes in an "
                             f"event or {self.config.max_stream_bytes} in all")
                    violation = True
                    log.warning("worker %s: %s; cut", worker.url, error)
                    yield error_event(STREAM_TOO_LARGE)
                    return
                chunk = await response.content.readany()
            if rest := framer.rest():
                yield rest
        except _WORKER_ERRORS as err:
            error = _describe(err)
            log.warning("worker %s failed mid-response: %s", worker.url, error)
            yield error_event(WORKER_LOST)
        finally:  # also when the client leaves: closing the connection aborts the request
            if violation:
                release(worker.worker_id, error, violation=True)
            else:
                release(worker.worker_id, error, output_tokens=produced.tokens,
                        usage=produced.usage)
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


class _EventFramer:
    """Cuts a relayed stream at its events' ends (a blank line), so the client gets whole
    events only, and holds the bounds: the part of an event not yet ended is at most
    `max_event_bytes`, the whole stream at most `max_stream_bytes`."""

    def __init__(self, config: ProxyConfig):
        self._config = config
        self._num_bytes = 0
        self._pending = bytearray()  # the events' bytes not yet ended
        self._num_scanned = 0  # of _pending, searched for an end already
        self.exceeded = False  # a bound was passed: relay what `feed` gave, then cut

    def feed(self, chunk: bytes) -> bytes:
        """The whole events `chunk` completes (maybe b""), within the stream's bound."""
        self._num_bytes += len(chunk)
        self._pending += chunk
        end = self._pending.rfind(b"\n\n", max(0, self._num_scanned - 1))
        out = b""
        if end >= 0:
            out = bytes(self._pending[:end + 2])
            del self._pending[:end + 2]
        self._num_scanned = len(self._pending)
        if self._num_bytes > self._config.max_stream_bytes:
            self.exceeded = True
            return b""
        self.exceeded = len(self._pending) > self._config.max_event_bytes
        return out

    def rest(self) -> bytes:
        """What the worker sent after its last blank line (relayed when it ends)."""
        return bytes(self._pending)


def _too_large(cap: int) -> APIError:
    return bad_worker(f"the worker's answer is larger than the {cap} bytes the gateway "
                      f"relays", "worker_response_too_large")


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
