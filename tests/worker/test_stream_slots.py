"""Concurrent streams per tenant: 429 with Retry-After over the limit,
the slot given back however the stream ends."""

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from worker.openai.http_errors import install_error_handlers
from worker.openai.stream_slots import StreamSlots, TooManyStreams


async def test_slots_are_per_tenant_and_released_when_the_stream_ends():
    slots = StreamSlots(2)
    slots.acquire("a")
    slots.acquire("a")
    slots.acquire("b")  # another tenant is not affected
    with pytest.raises(TooManyStreams):
        slots.acquire("a")

    async def body():
        yield b"x"
        raise RuntimeError("the engine went away")

    with pytest.raises(RuntimeError):
        async for _ in slots.hold("a", body()):
            pass
    assert slots.num_open("a") == 1
    held = slots.hold("a", body())
    assert await anext(held) == b"x"
    await held.aclose()  # the client left mid-stream
    assert slots.num_open("a") == 0 and slots.num_open("b") == 1


def test_429_carries_retry_after_and_an_openai_error_body():
    app = FastAPI()
    install_error_handlers(app)
    slots = StreamSlots(1)

    @app.post("/s")
    def stream_endpoint():
        slots.acquire("t")
        return {}

    client = TestClient(app)
    assert client.post("/s").status_code == 200
    resp = client.post("/s")
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "1"
    assert resp.json()["error"]["code"] == "too_many_concurrent_streams"
