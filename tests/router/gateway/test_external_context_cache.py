"""The gateway asks the workers' /v1/models for their context length once per set of up
workers: not again when only the set's version grows (it does with every scrape of the
workers' queue gauges, several times a second), which put a new HTTP client and a busy
worker's answer into the TTFT of the requests that arrived then."""

from types import SimpleNamespace

from aiohttp import web

from router.cluster.external_worker_set import WorkerSetConfig
from router.cluster.external_worker_spec import WorkerSetView, WorkerSpec, WorkerStatus
from router.core.router import RouterConfig
from router.gateway.external_gateway import ExternalGateway, ExternalGatewayConfig
from tests.router.lying_worker import LyingWorker


class CountingWorker(LyingWorker):
    """Counts the /v1/models requests that reach it."""

    num_models_asked = 0

    async def _models(self, request: web.Request) -> web.Response:
        self.num_models_asked += 1
        return await super()._models(request)


def view(version: int, *workers: LyingWorker) -> WorkerSetView:
    return WorkerSetView(version, tuple(WorkerStatus(WorkerSpec(w.url), "up")
                                        for w in workers))


async def test_the_context_is_asked_again_when_the_up_workers_change_not_the_version():
    a, b = CountingWorker(), CountingWorker()
    a.model_fields = {"max_model_len": 4096}
    b.model_fields = {"max_model_len": 2048}
    await a.start()
    await b.start()
    config = ExternalGatewayConfig(model="tiny", tokenizer="tiny", router=RouterConfig(),
                                   worker_set=WorkerSetConfig(model="tiny"))
    gateway = ExternalGateway(config, "test")
    try:
        router = SimpleNamespace(view=view(1, a))
        gateway.router = router
        assert await gateway._workers_context() == 4096
        for version in range(2, 12):  # gauges scraped: the same worker up, a new version
            router.view = view(version, a)
            assert await gateway._workers_context() == 4096
        assert (a.num_models_asked, b.num_models_asked) == (1, 0)
        router.view = view(12, b)  # the up workers changed: asked again
        assert await gateway._workers_context() == 2048
        assert (a.num_models_asked, b.num_models_asked) == (1, 1)
    finally:
        await gateway.aclose()
        await a.stop()
        await b.stop()
