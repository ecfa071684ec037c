"""The work other routers routed, counted in this router's load (router/cluster/shared_marks.py).

Several routers in front of one fleet each count only the work they routed: each sees the
others' only once a replica publishes it queued or running, a publish interval and a poll
later, so a burst that reaches several routers piles onto the replica each one thinks is
idle. So each router shares every decision's work (`RoutedWork`) and its end (`WorkEnd`)
through the index actor, and every other router adds it to its `LoadTracker` as it adds its
own (the same work, recent work and decode length), until the end comes.

A sender's calls may reach the actor out of order (several in flight), so an end can come
before its route: it is kept (at most `max_routes` of them), and the route, when it comes,
is not counted. A route id can be placed twice (Serve spilled it down the ranking, or
retried it), the first placement's end travelling with the second's route, ahead of the
first's: an end names its replica, so it releases only the placement it ended, and one that
matches no counted placement waits for its own.

An end can be lost. When the actor dropped messages before this router took them (it
polled late) it says so, and every route counted here goes (`lose_all`). Otherwise (the
sender died, or its outbox or call lost it) a remote route is dropped as the ledger drops a
direct route whose end never came (router/core/ledger.py): after `idle_grace_s` on a replica
whose fresh stats say it is idle, and after `lost_after_s` in any case.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from router.cluster.shared_marks import RoutedWork, WorkEnd
from router.core.load import LoadTracker


@dataclass(frozen=True)
class RemoteWorkConfig:
    idle_grace_s: float = 5.0  # the ledger's idle_grace_s
    lost_after_s: float = 600.0  # the ledger's lost_after_s
    max_routes: int = 1 << 16  # remote routes counted at once (and early ends kept); the
    # oldest go first

    def __post_init__(self):
        for name in ("idle_grace_s", "lost_after_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RemoteWorkConfig: {name} must be > 0, "
                                 f"got {getattr(self, name)}")
        if self.max_routes < 1:
            raise ValueError(f"RemoteWorkConfig: max_routes must be >= 1, "
                             f"got {self.max_routes}")


class _Route(NamedTuple):
    replica_id: str
    received_s: float  # monotonic


class RemoteWork:
    """Other routers' routes in `loads`, by their route id (which never meets one of this
    router's own: uuids). Call under the lock that guards the router."""

    def __init__(self, loads: LoadTracker, config: RemoteWorkConfig | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.loads = loads
        self.config = config or RemoteWorkConfig()
        self._clock = clock
        self._routes: dict[str, _Route] = {}  # insertion order: oldest first
        self._num_on: dict[str, int] = {}  # replica -> remote routes counted there
        # ends that came before their route (the sender's calls overtook each other), by
        # (route id, replica id; None: any placement)
        self._early_ends: OrderedDict[tuple[str, str | None], None] = OrderedDict()
        self.num_lost = 0  # routes dropped by a safety net, their end never seen

    def __len__(self) -> int:
        return len(self._routes)

    def add(self, replica_id: str, work: RoutedWork) -> None:
        """Counts a route another router sent to `replica_id` (unless its end came first;
        an earlier placement of the same id is replaced)."""
        for key in ((work.route_id, replica_id), (work.route_id, None)):
            if key in self._early_ends:
                del self._early_ends[key]
                return  # ended already: a later placement counted meanwhile stays
        self._drop(work.route_id)
        self.loads.add(work.route_id, replica_id, work.work_tokens, work.decode_tokens,
                       work.recent_tokens)
        self._routes[work.route_id] = _Route(replica_id, self._clock())
        self._num_on[replica_id] = self._num_on.get(replica_id, 0) + 1
        while len(self._routes) > self.config.max_routes:
            self._lose(next(iter(self._routes)))

    def end(self, end: WorkEnd) -> None:
        """A remote route ended on `end.replica_id`, or wherever it is counted when
        `end.any_placement` (one not counted: its route comes later, was never seen here,
        or was dropped already)."""
        route = self._routes.get(end.route_id)
        if route is None or not (end.any_placement or route.replica_id == end.replica_id):
            where = None if end.any_placement else end.replica_id
            self._early_ends[(end.route_id, where)] = None
            if len(self._early_ends) > self.config.max_routes:
                self._early_ends.popitem(last=False)
            return
        self._drop(end.route_id)
        if end.withdrawn:
            self.loads.withdraw(end.route_id)
        else:
            self.loads.finish(end.route_id, end.output_tokens)

    def expire(self, idle_replica_ids: frozenset[str]) -> int:
        """Drops the routes whose end is overdue (see the module docstring); returns how
        many. `idle_replica_ids`: the replicas whose fresh stats show nothing running."""
        now = self._clock()
        config = self.config
        young_s = min(config.idle_grace_s, config.lost_after_s)
        overdue = []
        # oldest first (a route counted again moves to the end): each poll scans only the
        # routes old enough to go, not all of them under the router's lock (5 ms at
        # max_routes, 20 polls a second)
        for route_id, (replica_id, received_s) in self._routes.items():
            age_s = now - received_s
            if age_s <= young_s:
                break
            if age_s > config.lost_after_s or (replica_id in idle_replica_ids
                                               and age_s > config.idle_grace_s):
                overdue.append(route_id)
        for route_id in overdue:
            self._lose(route_id)
        return len(overdue)

    def lose_all(self) -> int:
        """Drops every route (the actor dropped messages this router never took, and their
        ends may be among them: each would count here for `lost_after_s` on a busy
        replica); returns how many. The replicas' published stats count them a publish
        interval later, as they would without sharing."""
        route_ids = list(self._routes)
        for route_id in route_ids:
            self._lose(route_id)
        return len(route_ids)

    def forget_replica(self, replica_id: str) -> None:
        """The replica is gone: the routes counted there leave the load (if
        `LoadTracker.remove_replica` did not take them already)."""
        for route_id in [r for r, route in self._routes.items() if route.replica_id == replica_id]:
            self._drop(route_id)
            self.loads.finish(route_id)

    def num_on(self, replica_id: str) -> int:
        """Remote routes counted on the replica (the rest of its outstanding count is this
        router's own)."""
        return self._num_on.get(replica_id, 0)

    def _lose(self, route_id: str) -> None:
        self._drop(route_id)
        self.loads.finish(route_id)
        self.num_lost += 1

    def _drop(self, route_id: str) -> _Route | None:
        route = self._routes.pop(route_id, None)
        if route is not None:
            n = self._num_on[route.replica_id] - 1
            if n:
                self._num_on[route.replica_id] = n
            else:
                del self._num_on[route.replica_id]
        return route

    def check_invariants(self) -> None:
        counts: dict[str, int] = {}
        for route in self._routes.values():
            counts[route.replica_id] = counts.get(route.replica_id, 0) + 1
        assert counts == self._num_on, "remote counts per replica != remote routes"
        times = [route.received_s for route in self._routes.values()]
        assert times == sorted(times), "routes not oldest first (expire stops at a young one)"
        assert len(self._routes) <= self.config.max_routes, "over max_routes"
        assert len(self._early_ends) <= self.config.max_routes, "early ends over max_routes"
        assert self._early_ends.keys().isdisjoint(
            key for route_id, route in self._routes.items()
            for key in ((route_id, route.replica_id), (route_id, None))), (
            "a counted placement ended")
        for replica_id, n in counts.items():
            assert self.loads.num_outstanding(replica_id) >= n, (
                f"{replica_id}: {n} remote routes, fewer outstanding in the load")
