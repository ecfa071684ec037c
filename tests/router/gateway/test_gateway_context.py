"""The workers gateway refuses, before routing, a prompt its workers' context cannot hold
(it reads the context from a worker's /v1/models), so no such prompt is charged to a
worker's load; and a request of n completions is charged n of them."""

import json

import pytest

from router.cluster.external_worker_set import WorkerSetConfig
from router.cluster.external_worker_spec import WorkerSetView, WorkerSpec, WorkerStatus
from router.core.router import RouterConfig
from router.gateway.external_gateway import ExternalGateway, ExternalGatewayConfig
from router.gateway.external_router import ExternalWorkerRouter
from router.gateway.routed_body import chat_body, completion_body
from tests.router.lying_worker import LyingWorker
from worker.openai.errors import APIError

CONTEXT_TOKENS = 64


def body(**kw) -> bytes:
    return json.dumps({"model": "tiny", **kw}).encode()


@pytest.fixture
async def gateway():
    """A gateway (not connected to a cluster) whose one up worker lists a 64-token context."""
    worker = await LyingWorker().start()
    worker.model_fields = {"max_model_len": CONTEXT_TOKENS}
    config = ExternalGatewayConfig("tiny", "tiny", RouterConfig(block_size=16),
                                   WorkerSetConfig("tiny"))
    gateway = ExternalGateway(config, "g0")
    gateway.router = ExternalWorkerRouter(config.router, "tiny", "g0", worker_set=None)
    gateway.router.view = WorkerSetView(1, (WorkerStatus(WorkerSpec.parse(worker.url), "up"),))
    try:
        yield gateway
    finally:
        await gateway.aclose()
        await worker.stop()


@pytest.mark.parametrize("raw, code", [
    (body(prompt=list(range(1, 2_000)), max_tokens=4), "context_length_exceeded"),  # ids
    # more ids than a batch of prompts that fit the context: refused before it is parsed
    (body(prompt=list(range(1, 200_000)), max_tokens=4), "too_many_values"),
    # fits only without output
    (body(prompt=list(range(1, CONTEXT_TOKENS)), max_tokens=4), "context_length_exceeded"),
    # text that no tokenizing can fit
    (body(prompt="z" * 5000, max_tokens=1), "context_length_exceeded"),
], ids=["2k ids", "200k ids", "63 ids and 4 more", "5000 chars"])
async def test_a_prompt_over_the_workers_context_is_a_400_before_routing(gateway, raw, code):
    with pytest.raises(APIError) as err:
        await gateway._routed(completion_body, raw, "")
    assert (err.value.status_code, err.value.code) == (400, code)


async def test_a_chat_over_the_workers_context_is_a_400_before_routing(gateway):
    raw = body(messages=[{"role": "user", "content": "x" * 200}])
    with pytest.raises(APIError) as err:
        await gateway._routed(chat_body, raw, "")
    assert (err.value.status_code, err.value.code) == (400, "context_length_exceeded")


async def test_a_prompt_that_fits_is_routed_with_its_completions(gateway):
    routed = await gateway._routed(completion_body, body(prompt=[1, 2, 3], max_tokens=5, n=8),
                                   "")
    assert (routed.token_ids, routed.max_tokens, routed.num_sequences) == ([1, 2, 3], 40, 8)


def test_completions_count_n_times_the_prompts_of_a_batch():
    from worker.openai.prompt import PromptBuilder
    from worker.tokenizer.files import tokenizer_dir

    prompts = PromptBuilder(tokenizer_dir("tiny"), "tiny", 16)
    routed = completion_body(body(prompt=["ab", "cd", "ef"], n=2, max_tokens=3), prompts,
                             "tiny", "")
    assert (routed.max_tokens, routed.num_sequences) == (18, 6)
