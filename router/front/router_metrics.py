"""Router series of docs/metrics.md, in the gateway process's router registry."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kv.events import MEDIA
from router.core.ledger import RouteRecord
from router.core.miss_causes import CAUSES, MissTokens

DECISION_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01,
                      0.025, 0.1)
FALLBACK_REASONS = ("index_unreachable", "stale")
# A lost replica's replica_up stays at 0 this long (KvrouteReplicaDown fires after 2 min of
# it), then leaves: Serve replaces a lost replica under a new id, so the old one's series
# would otherwise stay at 0 for ever.
DOWN_SERIES_TTL_S = 600.0


class _RoutedSeries(NamedTuple):
    """One replica's labelled children that each routed request moves."""

    requests: Any
    prompt_tokens: Any
    device_hit_tokens: Any
    host_hit_tokens: Any


class RouterMetrics:
    def __init__(self, model: str, gateway_id: str, policy: str,
                 down_series_ttl_s: float = DOWN_SERIES_TTL_S):
        self.registry = r = CollectorRegistry()
        self._model, self._gateway, self._policy = model, gateway_id, policy
        self._down_series_ttl_s = down_series_ttl_s
        self._down_since_s: dict[str, float] = {}  # replica id -> when it was lost
        decision_labels = ("model", "gateway", "policy", "replica")
        # The labelled children each request moves, looked up once (a `labels()` lookup
        # costs ~1 us, 9 of them a request on the router's loop): dropped with their
        # series, so a replica that comes back gets the registry's new ones.
        self._routed: dict[str, _RoutedSeries] = {}
        self._outstanding: dict[str, Any] = {}
        self.requests = Counter("kvroute_router_requests", "Routing decisions",
                                decision_labels, registry=r)
        self.prompt_tokens = Counter("kvroute_router_prompt_tokens",
                                     "Prompt tokens of routed requests", decision_labels,
                                     registry=r)
        self.predicted_hit_tokens = Counter(
            "kvroute_router_predicted_hit_tokens",
            "Prompt tokens the router expected cached on the chosen replica",
            decision_labels + ("medium",), registry=r)
        self.decision_seconds = Histogram("kvroute_router_decision_seconds",
                                          "Time to pick a replica",
                                          ("model", "gateway", "policy"),
                                          buckets=DECISION_BUCKETS_S, registry=r)
        self.index_blocks = Gauge("kvroute_router_index_blocks",
                                  "Blocks in the router's index mirror", ("gateway", "medium"),
                                  registry=r)
        self.fallbacks = Counter("kvroute_router_fallbacks",
                                 "Decisions made in approximate mode (index unreachable, stale)",
                                 ("gateway", "reason"), registry=r)
        self.replica_up = Gauge("kvroute_router_replica_up", "1 while the replica is routable",
                                ("gateway", "replica"), registry=r)
        self.outstanding = Gauge("kvroute_router_outstanding_requests",
                                 "Requests routed and not finished", ("gateway", "replica"),
                                 registry=r)
        # Read-only view of the load the policy weighs (router.core.load), so a harness can
        # see a value that never decays or is not finite.
        self.load_tokens = Gauge("kvroute_router_load_tokens",
                                 "Outstanding work the policy weighs on the replica, in tokens",
                                 ("gateway", "replica"), registry=r)
        # The replica's own counts as this router last read them (its published stats): with
        # the router's outstanding requests, they tell a replica still running a request
        # from stats read late.
        self.published_requests = Gauge("kvroute_router_replica_requests",
                                        "Requests the replica last published, by state",
                                        ("gateway", "replica", "state"), registry=r)
        # Why the prompt tokens its engines did not serve from cache missed
        # (router/core/miss_causes.py), for the requests whose delivered count came back.
        self.miss_tokens = Counter("kvroute_miss_tokens",
                                   "Uncached prompt tokens of routed requests, by cause",
                                   ("model", "gateway", "cause"), registry=r)
        self._miss_tokens = tuple(self.miss_tokens.labels(model, gateway_id, cause)
                                  for cause in CAUSES)
        # Decisions shared with the other routers (their pending marks and routed work),
        # and theirs applied here (router/cluster/mark_sharing.py): with no traffic, each
        # router has received every decision the others sent.
        self.shared_decisions = Counter("kvroute_router_shared_decisions",
                                        "Decisions shared with the other routers, by direction",
                                        ("gateway", "direction"), registry=r)
        self._shared_totals = {"sent": 0, "received": 0}
        for direction in self._shared_totals:
            self.shared_decisions.labels(gateway_id, direction)
        # One more each time the series are refreshed for a push: a reader that sees it go
        # up twice reads values taken after its first look.
        self.refreshes = Counter("kvroute_router_series_refreshes",
                                 "Refreshes of this router's series for a push", ("gateway",),
                                 registry=r)
        self.refreshes.labels(gateway_id)
        self._decision_seconds = self.decision_seconds.labels(model, gateway_id, policy)
        for reason in FALLBACK_REASONS:
            self.fallbacks.labels(gateway_id, reason)
        for medium in MEDIA:
            self.index_blocks.labels(gateway_id, medium).set(0)

    def set_shared_decisions(self, sent: int, received: int) -> None:
        """The mirror's totals of decisions shared and received (the counters follow)."""
        for direction, total in (("sent", sent), ("received", received)):
            self.shared_decisions.labels(self._gateway, direction).inc(
                max(0, total - self._shared_totals[direction]))
            self._shared_totals[direction] = max(total, self._shared_totals[direction])
        self.refreshes.labels(self._gateway).inc()

    def add_replica(self, replica_id: str) -> None:
        labels = (self._model, self._gateway, self._policy, replica_id)
        self.requests.labels(*labels)
        self.prompt_tokens.labels(*labels)
        for medium in MEDIA:
            self.predicted_hit_tokens.labels(*labels, medium)
        self._down_since_s.pop(replica_id, None)
        self.replica_up.labels(self._gateway, replica_id).set(1)
        self.outstanding.labels(self._gateway, replica_id).set(0)
        self.load_tokens.labels(self._gateway, replica_id).set(0)

    def remove_replica(self, replica_id: str, now_s: float | None = None) -> None:
        """A gone replica's series leave this registry (its counters stop, not reset), but
        its replica_up reads 0 for `down_series_ttl_s` (then `drop_expired` removes it)."""
        self._routed.pop(replica_id, None)
        self._outstanding.pop(replica_id, None)
        labels = (self._model, self._gateway, self._policy, replica_id)
        for metric in (self.requests, self.prompt_tokens):
            _remove(metric, labels)
        for medium in MEDIA:
            _remove(self.predicted_hit_tokens, labels + (medium,))
        _remove(self.outstanding, (self._gateway, replica_id))
        _remove(self.load_tokens, (self._gateway, replica_id))
        for state in ("running", "waiting"):
            _remove(self.published_requests, (self._gateway, replica_id, state))
        self.replica_up.labels(self._gateway, replica_id).set(0)
        self._down_since_s[replica_id] = time.monotonic() if now_s is None else now_s

    def drop_expired(self, now_s: float | None = None) -> None:
        """Removes the replica_up series of replicas lost more than the TTL ago."""
        now_s = time.monotonic() if now_s is None else now_s
        cutoff = now_s - self._down_series_ttl_s
        for replica_id in [r for r, t in self._down_since_s.items() if t < cutoff]:
            del self._down_since_s[replica_id]
            _remove(self.replica_up, (self._gateway, replica_id))

    def observe_routed(self, record: RouteRecord) -> None:
        """A request sent where its ledger record says (counted once it is on its way)."""
        series = self._routed.get(record.replica_id)
        if series is None:
            labels = (self._model, self._gateway, self._policy, record.replica_id)
            series = self._routed[record.replica_id] = _RoutedSeries(
                self.requests.labels(*labels), self.prompt_tokens.labels(*labels),
                self.predicted_hit_tokens.labels(*labels, "device"),
                self.predicted_hit_tokens.labels(*labels, "host"))
        device_tokens, host_tokens = record.predicted_hit_tokens
        series.requests.inc()
        series.prompt_tokens.inc(record.num_prompt_tokens)
        series.device_hit_tokens.inc(device_tokens)
        series.host_hit_tokens.inc(host_tokens)
        self._decision_seconds.observe(record.decision_s)

    def observe_misses(self, causes: MissTokens) -> None:
        for child, tokens in zip(self._miss_tokens, causes):
            if tokens:
                child.inc(tokens)

    def observe_fallback(self, reason: str) -> None:
        self.fallbacks.labels(self._gateway, reason).inc()

    def set_outstanding(self, replica_id: str, num_requests: int) -> None:
        child = self._outstanding.get(replica_id)
        if child is None:
            child = self._outstanding[replica_id] = self.outstanding.labels(self._gateway,
                                                                            replica_id)
        child.set(num_requests)

    def set_load_tokens(self, replica_id: str, tokens: float) -> None:
        self.load_tokens.labels(self._gateway, replica_id).set(tokens)

    def set_published_requests(self, replica_id: str, num_running: float,
                               num_waiting: float) -> None:
        self.published_requests.labels(self._gateway, replica_id, "running").set(num_running)
        self.published_requests.labels(self._gateway, replica_id, "waiting").set(num_waiting)

    def set_index_blocks(self, blocks_by_medium: dict[str, int]) -> None:
        for medium, n in blocks_by_medium.items():
            self.index_blocks.labels(self._gateway, medium).set(n)


def _remove(metric, labels: tuple[str, ...]) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass
