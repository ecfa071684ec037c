"""Ends of direct-streaming requests, on their way from engine replicas to the routers that
routed them.

With direct streaming the request goes from HAProxy straight to the engine replica's HTTP
port, so the router that picked the replica never sees it end. The replica tells it through
the index actor: each publish carries the route ids that ended since the last one, by router
id, and each router's next poll takes its own. A router can route (and its request end)
before its first poll reaches the actor: ends for a router not yet polling are kept as for
one that just polled. A router that stops polling (or never starts) for `router_timeout_s`
loses its outbox (it is gone, or restarted under a new id: nothing would take them).

A replica also reports each routed request when it arrives there (its claim: the route id
marked by `claim_of`), through the same outboxes: a route no replica claims soon never
reached one, and its router releases it then rather than at a long timeout. A request the
replica answered with an error ends as a refusal (`refusal_of`): it ran nothing, so its
router takes back all it charged, its recent work included. An end carries the prompt
tokens the engine served from cache when it knows them (`end_of`): the router compares them
with what it predicted (router/core/miss_causes.py); and the output tokens the request
produced: the router charged it the decode it expected, and corrects that to the work done
(router/core/load.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

CLAIM_MARK = "+"  # before a route id: its request reached its replica (route ids are hex)
REFUSAL_MARK = "-"  # before a route id: its replica answered it with an error, ran nothing
CACHED_MARK = "="  # after an ended route id: the prompt tokens its engine served from cache
OUTPUT_MARK = "/"  # after an ended route id (and its cached tokens): the tokens it produced


def claim_of(route_id: str) -> str:
    return CLAIM_MARK + route_id


def refusal_of(route_id: str) -> str:
    return REFUSAL_MARK + route_id


def end_of(route_id: str, cached_tokens: int | None, output_tokens: int | None = None
           ) -> str:
    """An ended route, with the prompt tokens its engine served from cache and the tokens
    it produced, each when known."""
    cached = "" if cached_tokens is None else f"{CACHED_MARK}{cached_tokens}"
    output = "" if output_tokens is None else f"{OUTPUT_MARK}{output_tokens}"
    return f"{route_id}{cached}{output}"


class RouteReports(NamedTuple):
    claimed: list[str]
    ended: list[str]
    refused: list[str]  # ended too, with no work done
    cached_tokens: dict[str, int]  # ended route id -> prompt tokens served from cache
    output_tokens: dict[str, int]  # ended route id -> tokens it produced


def split_reports(reported: Sequence[str]) -> RouteReports:
    """A router's reported route ids, by kind."""
    out = RouteReports([], [], [], {}, {})
    for route_id in reported:
        if route_id.startswith(CLAIM_MARK):
            out.claimed.append(route_id[len(CLAIM_MARK):])
        elif route_id.startswith(REFUSAL_MARK):
            out.refused.append(route_id[len(REFUSAL_MARK):])
        else:
            route_id, has_output, output = route_id.partition(OUTPUT_MARK)
            route_id, has_cached, cached = route_id.partition(CACHED_MARK)
            out.ended.append(route_id)
            if has_cached and cached.isdigit():
                out.cached_tokens[route_id] = int(cached)
            if has_output and output.isdigit():
                out.output_tokens[route_id] = int(output)
    return out


class RouteEnds:
    def __init__(self, router_timeout_s: float):
        self._router_timeout_s = router_timeout_s
        self._outbox: dict[str, list[str]] = {}  # router id -> ended route ids
        # router id -> last take, or the first end for a router not yet polling (monotonic s)
        self._last_poll_s: dict[str, float] = {}

    def add(self, ended: Mapping[str, Sequence[str]]) -> bool:
        """Queues route ids for their routers; True when any router gets news."""
        now = time.monotonic()
        news = False
        for router_id, route_ids in ended.items():
            if not route_ids:
                continue
            last = self._last_poll_s.setdefault(router_id, now)  # not polling yet: its grace
            if now - last > self._router_timeout_s:
                continue  # a router that stopped polling: nothing would take them
            self._outbox.setdefault(router_id, []).extend(route_ids)
            news = True
        return news

    def take(self, router_id: str) -> tuple[str, ...]:
        """The router's ended route ids since its last take (it is polling: keep its box)."""
        now = time.monotonic()
        self._last_poll_s[router_id] = now
        cutoff = now - self._router_timeout_s
        for gone in [r for r, t in self._last_poll_s.items() if t < cutoff]:
            del self._last_poll_s[gone]
            self._outbox.pop(gone, None)
        return tuple(self._outbox.pop(router_id, ()))

    def num_queued(self) -> int:
        return sum(len(ids) for ids in self._outbox.values())
