"""Ends of direct-streaming requests, on their way from engine replicas to the routers that
routed them.

With direct streaming the request goes from HAProxy straight to the engine replica's HTTP
port, so the router that picked the replica never sees it end. The replica tells it through
the index actor: a request's end goes as it ends, with a publish when one is due, else
alone (`report_routes`; one call in flight and a gap between the calls that carry reports:
what ends meanwhile goes with the next), by router id; the actor wakes the routing router's
long poll, which takes its own, at most once a gap for ends
alone (`min_take_gap_s`, `due_s`: on a busy router ends wait for it, or go with the poll's
other news). The other routers, which count the route's work in their load
(router/cluster/remote_work.py), get its end from the actor at the same time, as a work end
in the routing router's name (`work_ends_of`), so the routing router sends nothing back. A
router can route (and its request end) before its first poll reaches the actor: ends for a
router not yet polling are kept as for one that just polled. A router that stops polling
(or never starts) for `router_timeout_s` loses its outbox and is remembered as gone (its
ledger died with it, or it restarted under a new id: nothing would take them), so later
ends for it are dropped rather than queued for another `router_timeout_s` (the other
routers had them as work ends already).

A replica also reports each routed request when it arrives there (its claim: the route id
marked by `claim_of`), through the same outboxes: a route no replica claims soon never
reached one, and its router releases it then rather than at a long timeout. A request the
replica answered with an error ends as a refusal (`refusal_of`): it ran nothing, so its
router takes back all it charged, its recent work included. An end carries the prompt
tokens the engine served from cache when it knows them (`end_of`): the router compares them
with what it predicted (router/core/miss_causes.py); and the output tokens the request
produced: the router charged it the decode it expected, and corrects that to the work done
(router/core/load.py); and when it ended, by the replica's clock (`ENDED_AT_MARK`): the router
measures how late the end reached it (kvroute_router_end_delay_seconds).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from router.cluster.shared_marks import WorkEnd

CLAIM_MARK = "+"  # before a route id: its request reached its replica (route ids are hex)
REFUSAL_MARK = "-"  # before a route id: its replica answered it with an error, ran nothing
CACHED_MARK = "="  # after an ended route id: the prompt tokens its engine served from cache
OUTPUT_MARK = "/"  # after an ended route id (and its cached tokens): the tokens it produced
ENDED_AT_MARK = "@"  # last: when it ended, the replica's time.time()
MAX_GONE_ROUTERS = 4096  # gone router ids remembered (the oldest forgotten first)


def claim_of(route_id: str) -> str:
    return CLAIM_MARK + route_id


def refusal_of(route_id: str) -> str:
    return REFUSAL_MARK + route_id


def end_of(route_id: str, cached_tokens: int | None, output_tokens: int | None = None,
           ended_at_s: float | None = None) -> str:
    """An ended route, with the prompt tokens its engine served from cache, the tokens it
    produced and when it ended (time.time() seconds), each when known."""
    cached = "" if cached_tokens is None else f"{CACHED_MARK}{cached_tokens}"
    output = "" if output_tokens is None else f"{OUTPUT_MARK}{output_tokens}"
    ended_at = "" if ended_at_s is None else f"{ENDED_AT_MARK}{ended_at_s:.6f}"
    return f"{route_id}{cached}{output}{ended_at}"


class RouteReports(NamedTuple):
    claimed: list[str]
    ended: list[str]
    refused: list[str]  # ended too, with no work done
    cached_tokens: dict[str, int]  # ended route id -> prompt tokens served from cache
    output_tokens: dict[str, int]  # ended route id -> tokens it produced
    ended_at_s: dict[str, float]  # ended route id -> when it ended (the replica's time.time())


def split_reports(reported: Sequence[str]) -> RouteReports:
    """A router's reported route ids, by kind."""
    out = RouteReports([], [], [], {}, {}, {})
    for route_id in reported:
        if route_id.startswith(CLAIM_MARK):
            out.claimed.append(route_id[len(CLAIM_MARK):])
        elif route_id.startswith(REFUSAL_MARK):
            out.refused.append(route_id[len(REFUSAL_MARK):])
        else:
            route_id, has_ended_at, ended_at = route_id.partition(ENDED_AT_MARK)
            route_id, has_output, output = route_id.partition(OUTPUT_MARK)
            route_id, has_cached, cached = route_id.partition(CACHED_MARK)
            out.ended.append(route_id)
            if has_cached and cached.isdigit():
                out.cached_tokens[route_id] = int(cached)
            if has_output and output.isdigit():
                out.output_tokens[route_id] = int(output)
            if has_ended_at:
                try:
                    out.ended_at_s[route_id] = float(ended_at)
                except ValueError:
                    pass  # a malformed time: the end still counts, untimed
    return out


def work_ends_of(replica_id: str, reports: Sequence[str]) -> list[WorkEnd]:
    """The ends and refusals among a router's reports from `replica_id`, as the work ends it
    would share (claims go): each releases its route wherever the others counted it."""
    split = split_reports(reports)
    out = [WorkEnd(r, replica_id, False, split.output_tokens.get(r), any_placement=True)
           for r in split.ended]
    out.extend(WorkEnd(r, replica_id, True, any_placement=True) for r in split.refused)
    return out


class RouteEnds:
    def __init__(self, router_timeout_s: float, max_gone_routers: int = MAX_GONE_ROUTERS,
                 min_take_gap_s: float = 0.0):
        """`min_take_gap_s`: a router's reports are due (`due_s`) no sooner than this after
        it last took some."""
        self._router_timeout_s = router_timeout_s
        self._min_take_gap_s = min_take_gap_s
        # router id -> when it last took reports (monotonic s)
        self._last_taken_s: dict[str, float] = {}
        self._max_gone_routers = max_gone_routers
        # router id -> its claims and ends, in their order
        self._outbox: dict[str, list[str]] = {}
        # router id -> last take, or the first end for a router not yet polling (monotonic s)
        self._last_poll_s: dict[str, float] = {}
        # routers that stopped polling: ends for them are dropped, not queued anew
        self._gone: OrderedDict[str, None] = OrderedDict()

    def add(self, ended: Mapping[str, Sequence[str]]) -> list[str]:
        """Queues a replica's reports for their routers; returns the routers that got news."""
        now = time.monotonic()
        self._expire(now)
        news = []
        for router_id, route_ids in ended.items():
            if not route_ids:
                continue
            if router_id in self._gone:
                continue
            self._last_poll_s.setdefault(router_id, now)  # not polling yet: its grace
            self._outbox.setdefault(router_id, []).extend(route_ids)
            news.append(router_id)
        return news

    def take(self, router_id: str) -> tuple[str, ...]:
        """The router's ended route ids since its last take (it is polling: keep its box)."""
        now = time.monotonic()
        self._gone.pop(router_id, None)  # it polls: not gone after all
        self._last_poll_s[router_id] = now
        self._expire(now)
        taken = tuple(self._outbox.pop(router_id, ()))
        if taken:
            self._last_taken_s[router_id] = now
        return taken

    def due_s(self, router_id: str) -> float | None:
        """When the router's queued reports should go to it (monotonic s: `min_take_gap_s`
        after it last took some; in the past if they should go now), None if it has none."""
        if router_id not in self._outbox:
            return None
        return self._last_taken_s.get(router_id, -math.inf) + self._min_take_gap_s

    def num_queued(self) -> int:
        return sum(len(ids) for ids in self._outbox.values())

    def _expire(self, now: float) -> None:
        cutoff = now - self._router_timeout_s
        for gone in [r for r, t in self._last_poll_s.items() if t < cutoff]:
            del self._last_poll_s[gone]
            self._last_taken_s.pop(gone, None)
            self._gone[gone] = None
            if len(self._gone) > self._max_gone_routers:
                self._gone.popitem(last=False)
            self._outbox.pop(gone, None)
