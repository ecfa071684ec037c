"""Request latency as the client sees it, measured where the request enters kvroute.

Every serving path's front (the gateway, the direct-ingress engine replica app, the
external-workers gateway) keeps these histograms (docs/metrics.md, "Gateway latency"). The
engine's own kvroute_engine_ttft_seconds starts when the engine receives the request; these
start when the HTTP request reached the front (`mark_arrival`, called by its ASGI counting
middleware), so they also hold body parsing, tokenizing, hashing, routing, the hop to the
engine and its queue:

- preprocess: arrival -> the request handed to the engine (validate, tokenize, hash; route
  where the front routes it);
- queue: arrival -> the engine first schedules it (its TTFT minus the engine's own compute
  of the first token, which the engine reports on the first delta);
- ttft: arrival -> the first token reached the front;
- tpot: the time per output token after the first delivery;
- e2e: arrival -> the last token reached the front.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

from protocol.engine import TokenDelta

ARRIVAL_KEY = "kvroute.arrival_s"  # ASGI scope key: time.monotonic() at arrival
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
PREPROCESS_BUCKETS_S = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
                        1)


def mark_arrival(scope: dict[str, Any]) -> None:
    """Stamps the request's arrival into its ASGI scope (the first stamp counts)."""
    scope.setdefault(ARRIVAL_KEY, time.monotonic())


def arrival_of(scope: dict[str, Any]) -> float:
    """When the request arrived; now, if nothing stamped it."""
    return scope.get(ARRIVAL_KEY) or time.monotonic()


class LatencyMetrics:
    """The front's latency histograms, labelled by served model, in `registry`."""

    def __init__(self, registry: CollectorRegistry, model: str,
                 clock: Callable[[], float] = time.monotonic):
        self.clock = clock  # time.monotonic, as `mark_arrival` stamps; tests give their own
        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            metric = Histogram(name, doc, ("model",), buckets=buckets, registry=registry)
            return metric.labels(model)  # exists from the start, so rates have a 0

        self.preprocess = hist("kvroute_gateway_preprocess_seconds",
                               "Arrival to the request handed to the engine (validate, "
                               "tokenize, hash, route)", PREPROCESS_BUCKETS_S)
        self.queue = hist("kvroute_gateway_queue_seconds",
                          "Arrival to the engine first scheduling the request",
                          LATENCY_BUCKETS_S)
        self.ttft = hist("kvroute_gateway_ttft_seconds",
                         "Arrival to the first token at the gateway", LATENCY_BUCKETS_S)
        self.tpot = hist("kvroute_gateway_tpot_seconds",
                         "Time per output token after the first, at the gateway",
                         TPOT_BUCKETS_S)
        self.e2e = hist("kvroute_gateway_e2e_seconds",
                        "Arrival to the last token at the gateway", LATENCY_BUCKETS_S)

    def timer(self, arrival_s: float) -> RequestTimer:
        return RequestTimer(self, arrival_s)


class RequestTimer:
    """One request's latency: `dispatched()` when it is handed to the engine, then its
    deltas through `watch`. A request retried from the start (a replica lost) is watched
    again; its TTFT and queue time count once, from the first attempt that got a token."""

    __slots__ = ("_metrics", "_arrival_s", "_first_token_seen")

    def __init__(self, metrics: LatencyMetrics, arrival_s: float):
        self._metrics = metrics
        self._arrival_s = arrival_s
        self._first_token_seen = False

    def dispatched(self) -> None:
        self._metrics.preprocess.observe(self._metrics.clock() - self._arrival_s)

    async def watch(self, deltas: AsyncGenerator[TokenDelta, None]
                    ) -> AsyncGenerator[TokenDelta, None]:
        """`deltas`, observed. Closing the result closes `deltas`."""
        metrics, arrival_s = self._metrics, self._arrival_s
        first_s: float | None = None
        num_first_tokens = num_tokens = 0
        try:
            async for delta in deltas:
                now = metrics.clock()
                num_tokens += len(delta.token_ids)
                if first_s is None and delta.token_ids:
                    first_s, num_first_tokens = now, num_tokens
                    self._first_token(now, delta.first_token_compute_s)
                if delta.finish_reason is not None and delta.finish_reason != "error":
                    metrics.e2e.observe(now - arrival_s)
                    if first_s is not None and num_tokens > num_first_tokens:
                        metrics.tpot.observe((now - first_s) / (num_tokens - num_first_tokens))
                yield delta
        finally:
            await deltas.aclose()

    def _first_token(self, now: float, compute_s: float | None) -> None:
        if self._first_token_seen:
            return
        self._first_token_seen = True
        self._metrics.ttft.observe(now - self._arrival_s)
        if compute_s is not None:
            self._metrics.queue.observe(max(now - self._arrival_s - compute_s, 0.0))


async def relayed(metrics: LatencyMetrics, arrival_s: float,
                  body: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """A relayed SSE body (the external-workers gateway), observed: TTFT at its first event,
    TPOT per event after it (vLLM streams one token per event), e2e at its end. The engine
    is another server's, so its queue time is not known here."""
    first_s: float | None = None
    num_events = 0
    finished = False
    try:
        async for chunk in body:
            num_events += chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
            if first_s is None and num_events:
                first_s = metrics.clock()
                metrics.ttft.observe(first_s - arrival_s)
            yield chunk
        finished = True
    finally:
        await body.aclose()  # the relay releases its worker when closed
        if finished:
            now = metrics.clock()
            metrics.e2e.observe(now - arrival_s)
            if first_s is not None and num_events > 1:
                metrics.tpot.observe((now - first_s) / (num_events - 1))
