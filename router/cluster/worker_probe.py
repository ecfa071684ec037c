"""HTTP checks of one external worker: is it up, does it serve the model, how busy is it.

Each returns what it found or a message saying what is wrong (naming the worker), never
raises for a worker that is down or misbehaves: the caller decides what a failure means.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from router.cluster.worker_spec import WorkerSpec
from worker.api import EngineStats

# vLLM's queue gauges (a `kvroute engine` exports them too); summed over their label sets
# (a data-parallel vLLM server reports one series per engine).
RUNNING_GAUGE = "vllm:num_requests_running"
WAITING_GAUGE = "vllm:num_requests_waiting"


def _describe(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return f"{type(err).__name__}: {text}" if type(err).__name__ not in text else text


async def check_health(client: httpx.AsyncClient, spec: WorkerSpec,
                       timeout_s: float) -> str | None:
    """None when GET /health answers 200, else why the worker is unusable."""
    try:
        response = await client.get(f"{spec.url}/health", timeout=timeout_s)
    except httpx.HTTPError as err:
        return f"worker {spec.url} is unreachable: {_describe(err)}"
    if response.status_code != 200:
        return (f"worker {spec.url} is unhealthy: GET /health answered "
                f"{response.status_code} {response.text[:200]!r}")
    return None


async def check_model(client: httpx.AsyncClient, spec: WorkerSpec, model: str,
                      timeout_s: float) -> str | None:
    """None when GET /v1/models lists `model`, else why the worker cannot serve it."""
    try:
        response = await client.get(f"{spec.url}/v1/models", timeout=timeout_s)
        response.raise_for_status()
        ids = [m["id"] for m in response.json()["data"]]
    except httpx.HTTPError as err:
        return f"worker {spec.url}: GET /v1/models failed: {_describe(err)}"
    except (ValueError, KeyError, TypeError) as err:
        return f"worker {spec.url}: GET /v1/models is not an OpenAI model list: {err!r}"
    if model not in ids:
        return f"worker {spec.url} does not serve the model {model!r} (it serves {ids})"
    return None


async def check_worker(client: httpx.AsyncClient, spec: WorkerSpec, model: str,
                       timeout_s: float) -> str | None:
    """Health, then the model: None when the worker can take this model's requests."""
    return (await check_health(client, spec, timeout_s)
            or await check_model(client, spec, model, timeout_s))


async def scrape_queue_stats(client: httpx.AsyncClient, spec: WorkerSpec,
                             timeout_s: float) -> EngineStats | None:
    """The worker's queue from its vLLM gauges; None when it does not export them (or
    /metrics fails: the load term then counts only the gateways' own in-flight requests)."""
    try:
        response = await client.get(f"{spec.url}/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return queue_stats_from_metrics(response.text)


def queue_stats_from_metrics(text: str) -> EngineStats | None:
    """Running and waiting requests from Prometheus text; None without both gauges."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name in (RUNNING_GAUGE, WAITING_GAUGE):
                totals[family.name] = sum(s.value for s in family.samples
                                          if s.name == family.name)
    except ValueError:  # not Prometheus text
        return None
    if len(totals) != 2:
        return None
    # Only the queue is known. The load tracker reads num_running and num_waiting (times
    # the mean decode length); the pool fields stay 0, as for a replica with no pool data.
    return EngineStats(num_running=int(totals[RUNNING_GAUGE]),
                       num_waiting=int(totals[WAITING_GAUGE]), num_queued_prefill_tokens=0,
                       num_blocks=0, num_used_blocks=0, num_cached_blocks=0,
                       num_pinned_blocks=0, num_free_blocks=0, num_host_blocks=0,
                       num_host_cached_blocks=0)
