"""The gateway's own series (docs/metrics.md): HTTP requests by endpoint and status, and the
requests' latency as the gateway sees it (worker/openai/latency.py)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

from worker.openai.latency import LatencyMetrics, mark_arrival

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
        self.latency = LatencyMetrics(self.registry, model)

    def observe(self, path: str, status_code: int) -> None:
        self.requests.labels(self._model, endpoint_label(path), str(status_code)).inc()


class CountRequests:
    """ASGI middleware stamping each HTTP request's arrival (for the latency histograms) and
    counting its response into `app.state.gateway_metrics` (when set) by endpoint and
    status: plain ASGI, so no task and no stream per request (Starlette's
    `@app.middleware("http")` adds both, and re-streams every response body)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        mark_arrival(scope)
        status = 500  # an exception no handler turned into a response

        async def send_counted(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            metrics = getattr(scope["app"].state, "gateway_metrics", None)
            if metrics is not None:
                metrics.observe(scope["path"], status)
