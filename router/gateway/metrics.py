"""The gateway's own series (docs/metrics.md): HTTP requests by endpoint and status."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/prefixes",
             "/v1/workers", "/health", "/ready", "/metrics")


def endpoint_label(path: str) -> str:
    """A bounded label: a known endpoint, or "other" (never the raw path)."""
    if path.startswith("/v1/prefixes"):
        return "/v1/prefixes"
    return path if path in ENDPOINTS else "other"


class GatewayMetrics:
    def __init__(self, model: str):
        self.registry = CollectorRegistry()
        self._model = model
        self.requests = Counter("kvroute_gateway_requests", "HTTP requests by status code",
                                ("model", "endpoint", "status"), registry=self.registry)

    def observe(self, path: str, status_code: int) -> None:
        self.requests.labels(self._model, endpoint_label(path), str(status_code)).inc()
