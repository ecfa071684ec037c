"""The external gateway's guards, against real servers: a client that leaves a non-streamed
request cancels it on the worker (uvicorn in front, a real worker behind), and only
OpenAI's fields and kvroute's documented extensions are forwarded."""

import asyncio
import json

import pytest
import uvicorn
from aiohttp import web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from router.cluster.external_worker_spec import WorkerSpec
from router.gateway.external_fields import CHAT_FIELDS, COMPLETION_FIELDS, forward_body
from router.gateway.external_gateway import CLIENT_GONE, until_disconnected
from router.gateway.external_proxy import ExternalProxy
from router.gateway.routed_body import completion_body
from tests.router.lying_worker import LyingWorker
from worker.openai.errors import APIError
from worker.openai.prompt import PromptBuilder
from worker.tokenizer.files import tokenizer_dir


async def test_a_client_leaving_a_non_streamed_request_cancels_it_on_the_worker():
    worker = await LyingWorker().start()
    spec = WorkerSpec(worker.url)
    arrived = asyncio.Event()

    async def never_answers(request):
        arrived.set()
        await asyncio.Event().wait()

    worker.post = never_answers
    proxy = ExternalProxy()
    released: list[tuple[str, str | None]] = []
    statuses: list[int] = []

    async def endpoint(request: Request):
        await request.body()
        response = await until_disconnected(request, proxy.forward(
            "/v1/completions", b"{}", lambda tried: spec, lambda *a, **_: released.append(a)))
        statuses.append(response.status_code)
        return response

    app = Starlette(routes=[Route("/v1/completions", endpoint, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    serving = asyncio.get_running_loop().create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        await arrived.wait()  # the request is on the worker
        writer.close()  # the client leaves before any answer
        await asyncio.wait_for(worker.finished.wait(), 30)
    finally:
        server.should_exit = server.force_exit = True  # whatever requests are still open
        await serving
        await proxy.aclose()
        await worker.stop()
    assert worker.num_cancelled == 1  # the worker saw its request's connection close
    assert released == [(spec.worker_id, None)] and statuses == [CLIENT_GONE]


def allowed_body(raw: bytes, fields: frozenset[str], tenant: str) -> bytes:
    return forward_body(json.loads(raw), raw, fields, tenant)


def test_only_documented_fields_are_forwarded():
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 4, "top_k": 5, "ignore_eos": True,
            "kv_transfer_params": {"remote_host": "10.0.0.1"}, "cache_salt": "mine",
            "priority": -100, "guided_json": {}, "logits_processors": ["x"]}
    out = json.loads(allowed_body(json.dumps(body).encode(), COMPLETION_FIELDS, ""))
    assert out == {"model": "tiny", "prompt": "hi", "max_tokens": 4, "top_k": 5,
                   "ignore_eos": True}
    salted = json.loads(allowed_body(json.dumps({**body, "cache_salt": "tenant-a"}).encode(),
                                     COMPLETION_FIELDS, "tenant-a"))
    assert salted["cache_salt"] == "tenant-a"  # the gateway's own, set from the tenant
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "chat_template": "{{ secrets }}", "chat_template_kwargs": {"x": 1},
            "mm_processor_kwargs": {}, "max_completion_tokens": 3}
    assert json.loads(allowed_body(json.dumps(chat).encode(), CHAT_FIELDS, "")) == {
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 3}
    clean = json.dumps({"model": "tiny", "prompt": "hi", "stream": True}).encode()
    assert allowed_body(clean, COMPLETION_FIELDS, "") is clean  # untouched: no copy


def test_what_python_parsed_of_a_small_body_goes_on_as_the_client_sent_it():
    raw = b'{"model":"tiny","prompt":"hi","temperature":NaN,"top_p":1e400,"user":"\\ud800"}'
    sent = allowed_body(raw, COMPLETION_FIELDS, "tenant-a")  # re-written: salted
    assert b'"temperature":NaN' in sent and b'"top_p":Infinity' in sent  # the worker's 400
    assert json.loads(sent)["user"] == "\ud800" and b'"cache_salt":"tenant-a"' in sent


def test_the_gateway_reads_the_forwarded_body_from_its_one_parse():
    prompts = PromptBuilder(tokenizer_dir("tiny"), "tiny", 16)
    raw = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2,
                      "kv_transfer_params": {}, "cache_salt": "mine"}).encode()
    routed = completion_body(raw, prompts, "tiny", "tenant-a", fields=COMPLETION_FIELDS)
    assert json.loads(routed.body) == {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2,
                                       "cache_salt": "tenant-a"}
    assert routed.token_ids == [5, 6, 7]
    clean = json.dumps({"model": "tiny", "prompt": [5, 6, 7]}).encode()
    assert completion_body(clean, prompts, "tiny", "", fields=COMPLETION_FIELDS).body is clean


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest"}},
    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    {"type": "video_url", "video_url": {"url": "file:///etc/passwd"}}, "bare"])
def test_a_media_content_part_is_refused(part):
    chat = {"model": "tiny", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "look"}, part]}]}
    with pytest.raises(APIError) as info:
        allowed_body(json.dumps(chat).encode(), CHAT_FIELDS, "")
    assert (info.value.status_code, info.value.param) == (400, "messages.0.content.1")


async def test_what_the_worker_receives_has_no_extension_field():
    worker = await LyingWorker().start()
    received = []

    async def echo(request):
        received.append(await request.json())
        return web.json_response({"ok": True})

    worker.post = echo
    spec = WorkerSpec(worker.url)
    proxy = ExternalProxy()
    body = allowed_body(json.dumps({"model": "tiny", "prompt": "p", "kv_transfer_params": {
        "do_remote_decode": True}}).encode(), COMPLETION_FIELDS, "")
    try:
        await proxy.forward("/v1/completions", body, lambda tried: spec, lambda *a, **_: None)
    finally:
        await proxy.aclose()
        await worker.stop()
    assert received == [{"model": "tiny", "prompt": "p"}]
