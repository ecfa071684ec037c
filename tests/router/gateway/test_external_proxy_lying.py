"""The worker proxy against lying workers (real HTTP servers in the test's loop): it
follows no redirect, relays no non-JSON answer, reads no answer past its caps, cuts a
stream at its caps, and tells the client nothing a worker wrote."""

import json

import pytest
from aiohttp import web

from router.cluster.external_worker_spec import WorkerSpec
from router.gateway.external_proxy import ExternalProxy, ProxyConfig
from tests.router.lying_worker import LyingWorker
from worker.openai.errors import APIError

SMALL = ProxyConfig(max_response_bytes=1 << 20, max_event_bytes=1 << 16,
                    max_stream_bytes=1 << 20)
BODY = json.dumps({"model": "tiny", "prompt": "secret prompt", "cache_salt": "tenant-a"})


@pytest.fixture
async def workers():
    liar, target = await LyingWorker().start(), await LyingWorker().start()
    yield liar, target
    await liar.stop()
    await target.stop()


class Picks:
    def __init__(self, *specs: WorkerSpec):
        self.specs = specs
        self.released: list[tuple[str, str | None]] = []

    def pick(self, tried: frozenset[str]) -> WorkerSpec:
        if len(tried) == len(self.specs):  # as the gateway answers when none is left
            raise APIError(503, "no worker can take the request")
        return self.specs[len(tried)]

    def release(self, worker_id: str, error: str | None, **kind: bool) -> None:
        self.released.append((worker_id, error))


async def forward(liar: LyingWorker, config: ProxyConfig = SMALL, *more: WorkerSpec):
    picks = Picks(WorkerSpec(liar.url), *more)
    proxy = ExternalProxy(config)
    try:
        response = await proxy.forward("/v1/completions", BODY.encode(), picks.pick,
                                       picks.release)
        if hasattr(response, "body_iterator"):
            return b"".join([c async for c in response.body_iterator]), picks
        return response, picks
    finally:
        await proxy.aclose()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_a_502_and_is_not_followed(workers, status):
    liar, target = workers
    target.post = lambda request: web.json_response({"leaked": True})

    async def redirect(request):
        return web.Response(status=status, headers={"Location": f"{target.url}/internal"})

    liar.post = redirect
    with pytest.raises(APIError) as info:
        await forward(liar)
    assert (info.value.status_code, info.value.code) == (502, "worker_redirect")
    assert target.paths == []  # the prompt and salt went nowhere else
    assert liar.url not in info.value.message
    (released,) = (await forward_released(liar))
    assert released[1] is not None  # released as failed: the worker set checks it


async def forward_released(liar):
    picks = Picks(WorkerSpec(liar.url))
    proxy = ExternalProxy(SMALL)
    try:
        with pytest.raises(APIError):
            await proxy.forward("/v1/completions", BODY.encode(), picks.pick, picks.release)
    finally:
        await proxy.aclose()
    return picks.released


async def test_an_html_answer_is_a_502_not_relayed(workers):
    liar, _ = workers
    liar.post = lambda request: _async(web.Response(
        text="<html>internal admin page</html>", content_type="text/html"))
    with pytest.raises(APIError) as info:
        await forward(liar)
    assert (info.value.status_code, info.value.code) == (502, "worker_bad_response")
    assert "internal admin page" not in info.value.message


async def _async(value):
    return value


@pytest.mark.parametrize("with_length", [True, False])
async def test_a_body_over_the_cap_is_a_502_and_is_not_read_whole(workers, with_length):
    liar, _ = workers

    async def huge(request):
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if with_length:
            response.content_length = 64 << 20
        else:
            response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(64):  # 64 MiB offered, the cap is 1 MiB
            await response.write(b" " * (1 << 20))
        return response

    liar.post = huge
    with pytest.raises(APIError) as info:
        await forward(liar)
    assert (info.value.status_code, info.value.code) == (502, "worker_response_too_large")


async def test_a_body_within_the_cap_is_relayed_as_is(workers):
    liar, _ = workers
    answer = {"choices": [{"text": "x" * 1000}]}
    liar.post = lambda request: _async(web.json_response(answer, status=200))
    response, picks = await forward(liar)
    assert response.status_code == 200 and json.loads(response.body) == answer
    assert picks.released == [(WorkerSpec(liar.url).worker_id, None)]


def sse(request_chunks):
    async def handler(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in request_chunks:
            await response.write(chunk)
        return response
    return handler


async def test_an_endless_event_is_cut_with_an_error_event(workers):
    liar, _ = workers
    liar.post = sse([b'data: {"a": 1}\n\n', *[b"data: " + b"y" * 8192] * 64])
    relayed, picks = await forward(liar)
    events = relayed.decode().split("\n\n")
    assert events[0] == 'data: {"a": 1}'
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "worker_response_too_large" and liar.url not in error["message"]
    assert len(relayed) < (1 << 16) + 2 * 8192
    assert picks.released[0][1] is not None


async def test_a_stream_over_the_total_cap_is_cut(workers):
    liar, _ = workers
    event = b"data: " + b"z" * 4000 + b"\n\n"
    liar.post = sse([event] * 400)  # 1.6 MB of small events, the cap is 1 MiB
    relayed, _ = await forward(liar)
    assert relayed.endswith(b"\n\n")
    last = json.loads(relayed.decode().split("\n\n")[-2].removeprefix("data: "))
    assert last["error"]["code"] == "worker_response_too_large"
    events = relayed.split(b"\n\n")
    assert set(events[:-2]) == {event[:-2]}  # whole events only, then the error
    assert len(relayed) - len(events[-2]) <= 1 << 20


async def test_events_split_across_chunks_are_counted_per_event(workers):
    liar, _ = workers
    event = b"data: " + b"w" * 40000 + b"\n\n"  # 40 KB events under the 64 KiB event cap
    chunks = []
    for _ in range(20):  # split on the blank line itself: "...\n" | "\n"
        chunks += [event[:-1], event[-1:]]
    liar.post = sse(chunks)
    relayed, picks = await forward(liar)
    assert relayed == event * 20
    assert picks.released == [(WorkerSpec(liar.url).worker_id, None)]


async def test_a_retried_failure_tells_the_client_no_worker_text(workers):
    liar, _ = workers
    liar.post = lambda request: _async(web.Response(
        status=503, text=f"backend db at 10.0.0.7:5432 is down; {request.path}"))
    picks = Picks(WorkerSpec(liar.url))
    proxy = ExternalProxy(ProxyConfig(max_attempts=1))
    try:
        with pytest.raises(APIError) as info:
            await proxy.forward("/v1/completions", BODY.encode(), picks.pick, picks.release)
    finally:
        await proxy.aclose()
    assert info.value.status_code == 503
    assert "10.0.0.7" not in info.value.message and liar.url not in info.value.message
    assert "127.0.0.1" not in info.value.message
    assert "10.0.0.7" in picks.released[0][1]  # the worker set and the log still see it


async def test_a_worker_failure_is_a_502_quoting_none_of_its_text(workers):
    liar, _ = workers
    liar.post = lambda request: _async(web.json_response(
        {"error": "Traceback: /opt/secret/config.py line 3 db_password"}, status=500))
    response_error, released = None, None
    picks = Picks(WorkerSpec(liar.url))
    proxy = ExternalProxy(SMALL)
    try:
        with pytest.raises(APIError) as info:
            await proxy.forward("/v1/completions", BODY.encode(), picks.pick, picks.release)
        response_error, released = info.value, picks.released
    finally:
        await proxy.aclose()
    assert (response_error.status_code, response_error.code) == (502, "worker_error")
    assert "db_password" not in response_error.message
    assert "db_password" in released[0][1]  # the worker set and the log see it
