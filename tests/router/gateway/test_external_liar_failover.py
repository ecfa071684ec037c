"""The workers path against a lying worker beside an honest one (real HTTP servers in the
test's loop, the worker set's plain class, a gateway's ExternalWorkerRouter and proxy, no Ray): a
worker whose answer breaks the protocol is drained for a back-off and the request that met
it is served elsewhere; a worker that refuses a request (4xx) keeps none of its charge."""

import asyncio
import json

import pytest
from aiohttp import web

from router.cluster.external_worker_set import WorkerSet, WorkerSetConfig
from router.cluster.external_worker_spec import WorkerSpec
from router.core.router import RouterConfig
from router.gateway.external_proxy import ExternalProxy, ProxyConfig
from router.gateway.external_router import ExternalWorkerRouter, NoWorkerAvailable
from tests.router.cluster.test_external_worker_set import Followed
from tests.router.lying_worker import LyingWorker
from worker.openai.errors import APIError

SMALL = ProxyConfig(max_response_bytes=1 << 16)
BODY = json.dumps({"model": "tiny", "prompt": "victim prompt"}).encode()


class SetHandle:
    """The worker-set actor's handle, over the plain class: `x.remote(...)` awaits `x`."""

    def __init__(self, workers: WorkerSet):
        self.workers = workers
        self.reported = asyncio.Event()  # a report_failure call finished

        class Method:
            def __init__(self, call):
                self.remote = call

        async def report(*args):
            await workers.report_failure(*args)
            self.reported.set()

        self.poll = Method(workers.poll)
        self.report_failure = Method(report)


@pytest.fixture
async def cluster():
    liar, honest = await LyingWorker().start(), await LyingWorker().start()

    async def answer(request):
        return web.json_response({"object": "text_completion"})

    honest.post = answer
    specs = (WorkerSpec(liar.url), WorkerSpec(honest.url))
    workers = WorkerSet(WorkerSetConfig(model="tiny", workers=specs, health_period_s=3600.0,
                                        load_period_s=0.0), index=Followed())
    handle = SetHandle(workers)
    router = ExternalWorkerRouter(RouterConfig(), "tiny", "gw-test", handle)
    router._apply(await workers.poll(-1))  # what the poll loop does (it needs Ray)
    proxy = ExternalProxy(SMALL)
    yield liar, honest, router, handle, proxy
    await proxy.aclose()
    await workers.aclose()
    await liar.stop()
    await honest.stop()


async def send(router: ExternalWorkerRouter, proxy: ExternalProxy, name: str,
               num_prompt_tokens: int, prefer: str | None = None):
    """One request as the gateway forwards it; `prefer`: its first pick goes there."""
    routed: dict[str, str] = {}

    def pick(tried: frozenset[str]) -> WorkerSpec:
        exclude = tried | (frozenset(w for w in router._routable if w != prefer)
                           if prefer and not tried else frozenset())
        try:
            worker, _ = router.route(f"{name}~{len(tried)}", [], num_prompt_tokens, 16,
                                     exclude)
        except NoWorkerAvailable:  # as the gateway answers it
            raise APIError(503, "no worker can take the request") from None
        routed[worker.worker_id] = f"{name}~{len(tried)}"
        return worker

    def release(worker_id, error, **kind):
        router.release(routed[worker_id], error, **kind)

    return await proxy.forward("/v1/completions", BODY, pick, release)


@pytest.mark.parametrize("lie", ["redirect", "too_large", "not_json", "own_500"])
async def test_a_liar_is_drained_and_its_victim_served_by_the_honest_worker(cluster, lie):
    liar, honest, router, handle, proxy = cluster

    async def lying(request):
        if lie == "redirect":
            return web.Response(status=307, headers={"Location": f"{honest.url}/x"})
        if lie == "too_large":
            return web.json_response({"text": "x" * (1 << 17)})
        if lie == "not_json":
            return web.Response(text="<html>", content_type="text/html")
        return web.Response(status=500, text="Traceback ...")

    liar.post = lying
    first = await send(router, proxy, "r0", 64, prefer=WorkerSpec(liar.url).worker_id)
    assert first.status_code == 200  # retried on the honest worker before any byte
    await handle.reported.wait()
    (down,) = [w for w in router.view.workers if w.state == "down"]
    assert down.spec.url == liar.url and "broke the protocol" in down.error
    await handle.workers.check_all()  # its health check passes, but it is backing off
    assert [w.spec.url for w in (await handle.workers.poll(-1)).up()] == [honest.url]
    for i in range(1, 6):
        assert (await send(router, proxy, f"r{i}", 64)).status_code == 200
    assert liar.paths == ["POST /v1/completions"]  # the first answer only
    assert honest.paths == ["POST /v1/completions"] * 6


async def test_with_no_other_worker_the_liar_answer_is_a_502(cluster):
    liar, honest, router, handle, proxy = cluster

    async def redirect(request):
        return web.Response(status=302, headers={"Location": "/x"})

    liar.post = redirect
    await honest.stop()
    router._drain(WorkerSpec(honest.url).worker_id)
    with pytest.raises(APIError) as info:
        await send(router, proxy, "r0", 64)
    assert (info.value.status_code, info.value.code) == (502, "worker_redirect")


async def test_a_refused_request_leaves_no_load_on_its_worker(cluster):
    liar, honest, router, handle, proxy = cluster

    async def refuse(request):
        return web.json_response(
            {"error": {"message": "too long", "code": "context_length_exceeded"}}, status=400)

    liar.post = refuse
    liar_id = WorkerSpec(liar.url).worker_id
    response = await send(router, proxy, "r0", 490_000, prefer=liar_id)
    assert response.status_code == 400  # the client's answer, relayed
    assert router.router.loads.load(liar_id) == 0.0
    assert router.router.loads.num_outstanding(liar_id) == 0
    assert liar_id in router._routable  # a refusal is no failure of the worker
