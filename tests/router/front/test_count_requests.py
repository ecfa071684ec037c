"""CountRequests: every HTTP response counted by endpoint and status, streams included."""

import httpx
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from router.front.metrics import CountRequests, GatewayMetrics


def _app() -> tuple[FastAPI, GatewayMetrics]:
    app = FastAPI()
    metrics = GatewayMetrics("tiny")
    app.state.gateway_metrics = metrics

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions() -> StreamingResponse:
        async def body():
            yield b"data: 1\n\n"
            yield b"data: [DONE]\n\n"
        return StreamingResponse(body(), media_type="text/event-stream")

    @app.get("/metrics")
    async def broken() -> dict:
        raise RuntimeError("no handler turns this into a response")

    app.add_middleware(CountRequests)
    return app, metrics


def _count(metrics: GatewayMetrics, endpoint: str, status: str) -> float:
    return metrics.requests.labels("tiny", endpoint, status)._value.get()


async def test_responses_are_counted_by_endpoint_and_status():
    app, metrics = _app()
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/health")).status_code == 200
        streamed = await client.post("/v1/completions")
        assert streamed.text == "data: 1\n\ndata: [DONE]\n\n"
        assert (await client.get("/nowhere")).status_code == 404
        assert (await client.get("/metrics")).status_code == 500
    assert _count(metrics, "/health", "200") == 2
    assert _count(metrics, "/v1/completions", "200") == 1
    assert _count(metrics, "other", "404") == 1
    assert _count(metrics, "/metrics", "500") == 1
