"""An engine replica's side of direct routing: every request that carries a verified route
header is reported to the router that routed it, when it arrives (its claim) and when it
ends, whatever the path and the outcome (a 404, an error, the client leaving mid-stream);
an error status or a path that generates nothing ends it as refused (it ran nothing).

The router charges a replica's load when it routes a request there; with direct streaming
it sees neither the request arrive nor end. The claim tells it the request got here (a route
no replica claims within a few seconds never will: HAProxy's client left, or the request went
elsewhere, router/serve/request_router.py); the end releases the load, and a refusal all
the router charged for it. An end leaves soon (the publisher publishes early, with the
events drained so far, and the index actor wakes the routers' long polls; one publish in
flight and a short gap between the calls that carry reports, what ends meanwhile goes with
the next: a lone end at once), and claims with it or with the replica's next publish
(router/cluster/route_ends.py): an ended request's load counts on the router for that
round trip, not for a publish interval too.

A request whose route header does not verify (sent to the replica's port by anyone but
HAProxy) is served as one no router routed, and counted.

An end carries the prompt tokens the engine served from cache (worker/openai/prompt_hits.py),
which the router weighs against its prediction (the `race` miss cause), and the tokens the
request produced, which correct the decode the router charged it (router/core/load.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from router.cluster.route_ends import claim_of, end_of, refusal_of
from router.serve.route_header import ROUTE_HEADER, Route, RouteSigner
from worker.openai.prompt_hits import PROMPT_HITS_KEY, PromptHits

log = logging.getLogger(__name__)

ROUTED_BY_HEADER = "x-kvroute-router"  # on the response: the router id of the route header
_ROUTE_HEADER_BYTES = ROUTE_HEADER.encode()
# A routed request on any other path runs nothing on the engine (a 404, /tokenize,
# /v1/prefixes, whose pin is routed on its own): it ends as refused.
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
_ROUTED_BY_HEADER_BYTES = ROUTED_BY_HEADER.encode()


class RouteReports:
    """Claims and ends of routed requests since the publisher last took them, by router id
    (a claim is its route id marked by `claim_of`). Thread-safe: requests end on the HTTP
    server's loop, the publisher takes them on its own."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        """`clock`: when a request ends (seconds; the routers read it with their time.time())."""
        self._clock = clock
        self._reports: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._on_end: Callable[[], None] | None = None

    def on_end(self, listener: Callable[[], None] | None) -> None:
        """`listener()` is called after each end is queued (the publisher sends it soon)."""
        self._on_end = listener

    def claim(self, route: Route) -> None:
        self._add(route.router_id, claim_of(route.route_id))

    def end(self, route: Route, refused: bool = False, cached_tokens: int | None = None,
            output_tokens: int | None = None) -> None:
        """`refused`: nothing was generated (an error status, or not a generation path);
        `cached_tokens`: the prompt tokens the engine served from cache, when it ran;
        `output_tokens`: the tokens it produced, when it ran."""
        route_id = (refusal_of(route.route_id) if refused
                    else end_of(route.route_id, cached_tokens, output_tokens, self._clock()))
        self._add(route.router_id, route_id)
        if self._on_end is not None:
            self._on_end()

    def take(self) -> dict[str, tuple[str, ...]]:
        with self._lock:
            reports, self._reports = self._reports, {}
        return {router_id: tuple(ids) for router_id, ids in reports.items()}

    def pending(self) -> bool:
        """Whether any claim or end waits to be taken."""
        with self._lock:
            return bool(self._reports)

    def put_back(self, reports: dict[str, tuple[str, ...]]) -> None:
        """Reports a failed send took: ahead of those queued since."""
        with self._lock:
            for router_id, ids in reports.items():
                self._reports[router_id] = [*ids, *self._reports.get(router_id, ())]

    def _add(self, router_id: str, report: str) -> None:
        with self._lock:
            self._reports.setdefault(router_id, []).append(report)


def _path(scope) -> str:
    """The request's path within the app (Starlette's path includes its root path)."""
    path, root = scope["path"], scope.get("root_path", "").rstrip("/")
    return path[len(root):] if root and path.startswith(root + "/") else path


class RouteTracking:
    """ASGI middleware: claims and ends each routed request, and names its router on the
    response (clients and tests see the routing step worked)."""

    def __init__(self, app, signer: RouteSigner, reports: RouteReports,
                 on_forged: Callable[[], None] | None = None):
        self.app = app
        self.signer = signer
        self.reports = reports
        self.on_forged = on_forged
        self.num_forged = 0

    async def __call__(self, scope, receive, send) -> None:
        route = self._route(scope) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        routed_by = (_ROUTED_BY_HEADER_BYTES, route.router_id.encode())
        # it ran nothing: a path that generates nothing, or an error status (an exception
        # or a client that left may come after work: those end as run)
        refused = [_path(scope) not in GENERATION_PATHS]

        async def send_routed(message) -> None:
            if message["type"] == "http.response.start":
                refused[0] = refused[0] or message["status"] >= 400
                message = {**message, "headers": [*message.get("headers", ()), routed_by]}
            await send(message)

        hits = scope[PROMPT_HITS_KEY] = PromptHits()  # the serving layer fills it
        self.reports.claim(route)
        try:
            await self.app(scope, receive, send_routed)
        finally:
            self.reports.end(route, refused=refused[0], cached_tokens=hits.cached_tokens,
                             output_tokens=hits.output_tokens)

    def _route(self, scope) -> Route | None:
        for name, value in scope["headers"]:
            if name == _ROUTE_HEADER_BYTES:
                route = self.signer.verify(value.decode("latin-1"))
                if route is None:
                    self._forged()
                return route
        return None

    def _forged(self) -> None:
        self.num_forged += 1
        if self.num_forged == 1:
            log.warning("a request carried a route header that does not verify (not set by "
                        "HAProxy from an ingress router's answer): served as not routed; "
                        "further ones are counted, not logged")
        if self.on_forged is not None:
            self.on_forged()
