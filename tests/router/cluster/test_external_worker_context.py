"""The context length a worker lists in /v1/models, which the external gateway's /v1/models
repeats: taken only when it can be one (a lying worker's number reaches no client)."""

import httpx
import pytest

from router.cluster.external_worker_probe import listed_context
from router.cluster.external_worker_spec import WorkerSpec
from tests.router.lying_worker import LyingWorker


@pytest.fixture
async def worker():
    w = await LyingWorker().start()
    yield w
    await w.stop()


@pytest.mark.parametrize("fields, tokens", [
    ({"max_model_len": 4096}, 4096),
    ({}, None),  # lists none
    ({"max_model_len": 0}, None),
    ({"max_model_len": -5}, None),
    ({"max_model_len": 4096.0}, None),
    ({"max_model_len": "4096"}, None),
    ({"max_model_len": True}, None),
    ({"max_model_len": 1 << 40}, None),
])
async def test_a_listed_context_is_taken_only_when_it_can_be_one(worker, fields, tokens):
    worker.model_fields = fields
    async with httpx.AsyncClient(trust_env=False) as client:
        assert await listed_context(client, WorkerSpec.parse(worker.url), "tiny", 5.0) == tokens


async def test_another_models_context_is_not_taken(worker):
    worker.model_fields = {"max_model_len": 4096}
    async with httpx.AsyncClient(trust_env=False) as client:
        assert await listed_context(client, WorkerSpec.parse(worker.url), "other", 5.0) is None
