"""The routing mode of each external worker, per gateway (docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

MODES = ("events", "approximate")


class WorkerModeMetrics:
    """`kvroute_router_worker_mode{gateway, replica, mode}`: 1 for the mode the worker is
    routed in (events: its KV events are fresh; approximate: this gateway's routed
    history), 0 for the other."""

    def __init__(self, registry: CollectorRegistry, gateway_id: str):
        self._gateway = gateway_id
        self.mode = Gauge("kvroute_router_worker_mode",
                          "1 for the mode an external worker is routed in: events or "
                          "approximate (routed history)", ("gateway", "replica", "mode"),
                          registry=registry)

    def set(self, worker_id: str, approximate: bool) -> None:
        current = "approximate" if approximate else "events"
        for mode in MODES:
            self.mode.labels(self._gateway, worker_id, mode).set(int(mode == current))

    def remove(self, worker_id: str) -> None:
        for mode in MODES:
            try:
                self.mode.remove(self._gateway, worker_id, mode)
            except KeyError:
                pass
