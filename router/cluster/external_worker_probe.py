"""HTTP checks of one external worker: is it up, does it serve the model, how busy is it.

Each returns what it found or a message saying what is wrong (naming the worker), never
raises for a worker that is down or misbehaves: the caller decides what a failure means.
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple

import httpx
from prometheus_client.parser import text_string_to_metric_families

from protocol.engine import EngineStats
from router.cluster.external_worker_spec import WorkerSpec

# vLLM's queue gauges (a `kvroute engine` exports them too); summed over their label sets
# (a data-parallel vLLM server reports one series per engine).
RUNNING_GAUGE = "vllm:num_requests_running"
WAITING_GAUGE = "vllm:num_requests_waiting"
# More requests than any server queues: a larger gauge is a lie, not a load.
MAX_QUEUED_REQUESTS = 1_000_000
# vLLM's info gauge of its KV cache config (a `kvroute engine` exports it too): the labels
# `num_gpu_blocks` x `block_size` are its device KV capacity in tokens, summed over its
# label sets (one per data-parallel engine).
CACHE_CONFIG_INFO = "vllm:cache_config_info"
MAX_KV_CAPACITY_TOKENS = 1 << 40  # more than any server's KV memory holds: a lie
# What is read of one answer: vLLM's /metrics is ~100 KiB; more is a lying worker's.
MAX_PROBE_BYTES = 4 << 20


class GaugeError(ValueError):
    """A queue gauge that cannot be a queue length (NaN, infinite, negative or huge)."""


class _TooLarge(httpx.HTTPError):
    """The worker's answer is longer than MAX_PROBE_BYTES."""


async def _get(client: httpx.AsyncClient, url: str, timeout_s: float) -> tuple[int, str]:
    """GET `url`: its status and at most MAX_PROBE_BYTES of its body (more: _TooLarge)."""
    async with client.stream("GET", url, timeout=timeout_s) as response:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_PROBE_BYTES:
                raise _TooLarge(f"{url} answered more than {MAX_PROBE_BYTES} bytes")
        return response.status_code, body.decode(errors="replace")


def _describe(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return f"{type(err).__name__}: {text}" if type(err).__name__ not in text else text


async def check_health(client: httpx.AsyncClient, spec: WorkerSpec,
                       timeout_s: float) -> str | None:
    """None when GET /health answers 200, else why the worker is unusable."""
    try:
        status, text = await _get(client, f"{spec.url}/health", timeout_s)
    except httpx.HTTPError as err:
        return f"worker {spec.url} is unreachable: {_describe(err)}"
    if status != 200:
        return f"worker {spec.url} is unhealthy: GET /health answered {status} {text[:200]!r}"
    return None


async def check_model(client: httpx.AsyncClient, spec: WorkerSpec, model: str,
                      timeout_s: float) -> str | None:
    """None when GET /v1/models lists `model`, else why the worker cannot serve it."""
    try:
        status, text = await _get(client, f"{spec.url}/v1/models", timeout_s)
        if status != 200:
            return f"worker {spec.url}: GET /v1/models answered {status}"
        ids = [m["id"] for m in json.loads(text)["data"]]
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


class WorkerMetrics(NamedTuple):
    """What a worker's /metrics says: its queue, and its device KV capacity."""

    stats: EngineStats | None  # None: no queue gauges
    kv_capacity_tokens: int | None  # None: no usable vllm:cache_config_info


NO_METRICS = WorkerMetrics(None, None)


async def scrape_metrics(client: httpx.AsyncClient, spec: WorkerSpec,
                         timeout_s: float) -> WorkerMetrics:
    """The worker's queue and KV capacity from its vLLM gauges; each None when it does not
    export them (or /metrics fails: the load term then counts only the gateways' own
    in-flight requests, and the pooled bound knows no capacity).

    Raises GaugeError when a queue gauge is there but cannot be a queue length.
    """
    try:
        status, text = await _get(client, f"{spec.url}/metrics", timeout_s)
    except httpx.HTTPError:
        return NO_METRICS
    if status != 200:
        return NO_METRICS
    return metrics_from_text(text)


def queue_stats_from_metrics(text: str) -> EngineStats | None:
    """Running and waiting requests from Prometheus text (`metrics_from_text`)."""
    return metrics_from_text(text).stats


def metrics_from_text(text: str) -> WorkerMetrics:
    """Running and waiting requests (None without both gauges) and the KV capacity (None
    without a `vllm:cache_config_info` whose every series gives both counts) from
    Prometheus text.

    Raises GaugeError for a queue sample that is not a finite count in
    [0, MAX_QUEUED_REQUESTS] (one lying worker's NaN must not become anyone's load).
    """
    totals: dict[str, float] = {}
    capacity_tokens: int | None = None
    try:
        for family in text_string_to_metric_families(text):
            if family.name == CACHE_CONFIG_INFO:
                capacity_tokens = _kv_capacity_tokens(family.samples)
            if family.name in (RUNNING_GAUGE, WAITING_GAUGE):
                values = [s.value for s in family.samples if s.name == family.name]
                for value in values:
                    if not (math.isfinite(value) and 0 <= value <= MAX_QUEUED_REQUESTS):
                        raise GaugeError(f"{family.name} = {value!r} is not a queue length")
                totals[family.name] = sum(values)
    except GaugeError:
        raise
    except ValueError:  # not Prometheus text
        return NO_METRICS
    if len(totals) != 2:
        return WorkerMetrics(None, capacity_tokens)
    for name, total in totals.items():
        if total > MAX_QUEUED_REQUESTS:
            raise GaugeError(f"{name} sums to {total!r}, more than any queue")
    # Only the queue is known. The load tracker reads num_running and num_waiting (times
    # the mean decode length); the pool fields stay 0, as for a replica with no pool data.
    stats = EngineStats(num_running=int(totals[RUNNING_GAUGE]),
                        num_waiting=int(totals[WAITING_GAUGE]), num_queued_prefill_tokens=0,
                        num_blocks=0, num_used_blocks=0, num_cached_blocks=0,
                        num_pinned_blocks=0, num_free_blocks=0, num_host_blocks=0,
                        num_host_cached_blocks=0)
    return WorkerMetrics(stats, capacity_tokens)


def _kv_capacity_tokens(samples: list) -> int | None:
    """The sum over the info gauge's series of `num_gpu_blocks` x `block_size`; None when
    a series lacks either, or they are not counts (vLLM says "None" before it profiled
    its memory), or the total is more than any server holds."""
    total = 0
    for sample in samples:
        try:
            num_blocks = int(sample.labels["num_gpu_blocks"])
            block_size = int(sample.labels["block_size"])
        except (KeyError, ValueError):
            return None
        if num_blocks < 1 or block_size < 1:
            return None
        total += num_blocks * block_size
    return total if 0 < total <= MAX_KV_CAPACITY_TOKENS else None


MAX_CONTEXT_TOKENS = 1 << 31  # more than any model's context: a larger one is a lie


async def listed_context(client: httpx.AsyncClient, spec: WorkerSpec, model: str,
                         timeout_s: float) -> int | None:
    """The context length (tokens) the worker's /v1/models lists for `model` (vLLM, SGLang
    and `kvroute engine` list `max_model_len`); None when it lists none, fails, or lists
    one that cannot be a context length."""
    try:
        status, text = await _get(client, f"{spec.url}/v1/models", timeout_s)
        if status != 200:
            return None
        entries = [m for m in json.loads(text)["data"] if m.get("id") == model]
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return None
    tokens = entries[0].get("max_model_len") if entries else None
    if type(tokens) is not int or not 1 <= tokens <= MAX_CONTEXT_TOKENS:
        return None
    return tokens
