"""`kvroute engine` as a real subprocess (simulated executor), through the official openai
client and raw HTTP: completions and chat, streaming and not, usage with cached tokens,
every kind of bad input as an OpenAI error, vLLM's gauges on /metrics, aborts when the
client leaves, and a SIGTERM that lets the accepted request finish."""

import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.simlib.engine_workers import SIM_TINY_ARGS, EngineWorker
from worker.openai.prompt import PromptBuilder
from worker.tokenizer.files import tokenizer_dir

# The H100 preset decodes in ~8 ms a token: a long request lasts seconds, long enough to
# leave it or to stop the server under it.
SLOW_SIM_ARGS = ("--engine", "sim", "--sim-preset", "h100-llama3-8b")
VLLM_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
               "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@pytest.fixture(scope="module")
def worker():
    w = EngineWorker.start(SIM_TINY_ARGS)
    yield w
    assert w.stop() == 0


@pytest.fixture(scope="module")
def oai(worker):
    return openai.OpenAI(base_url=worker.base_url, api_key="unused", timeout=60,
                         max_retries=0)


@pytest.fixture(scope="module")
def prompts():
    return PromptBuilder(tokenizer_dir("tiny"), "tiny", 16)


def metric_samples(url: str) -> dict[str, float]:
    """Every sample on /metrics, keyed `name{label=value,...}` (labels sorted)."""
    out = {}
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def num_aborted(url: str) -> float:
    return sum(v for k, v in metric_samples(url).items()
               if k.startswith("kvroute_engine_requests_finished_total{") and "reason=abort" in k)


def wait_until(predicate, timeout_s: float, what: str):
    """Polls an eventually-true condition (the server reacts asynchronously) to a deadline."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)
    return value


def hit_tokens(num_prompt_tokens: int) -> int:
    """A repeated prompt's hits: its full blocks of 16, short of its last token (which is
    computed again to sample from)."""
    return (num_prompt_tokens - 1) // 16 * 16


def test_completions_usage_and_cached_tokens(oai, prompts):
    text = "The standalone kvroute engine answers like vLLM does. " * 2  # 108 bytes
    first = oai.completions.create(model="tiny", prompt=text, max_tokens=5)
    num_prompt_tokens = len(prompts.encode_text(text))
    assert first.object == "text_completion" and first.id.startswith("cmpl-")
    assert first.choices[0].finish_reason == "length"
    assert first.usage.prompt_tokens == num_prompt_tokens
    assert first.usage.completion_tokens == 5
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = oai.completions.create(model="tiny", prompt=text, max_tokens=1)
    assert second.usage.prompt_tokens_details.cached_tokens == hit_tokens(num_prompt_tokens)


def test_completions_token_ids_streamed_with_usage(oai):
    chunks = list(oai.completions.create(model="tiny", prompt=list(range(40, 80)),
                                         max_tokens=7, stream=True,
                                         stream_options={"include_usage": True}))
    choices = [c for c in chunks if c.choices]
    assert choices[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in choices[:-1])
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens) == (40, 7)


def test_chat_streaming_and_not(oai, prompts):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is a KV cache?"}]
    full = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    assert full.usage.prompt_tokens == len(prompts.encode_chat(messages))
    assert full.usage.completion_tokens == 4
    chunks = list(oai.chat.completions.create(model="tiny", messages=messages,
                                              max_completion_tokens=6, stream=True,
                                              stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 6
    cached = chunks[-1].usage.prompt_tokens_details.cached_tokens  # the same prompt again
    assert cached == hit_tokens(full.usage.prompt_tokens)


def test_models_and_health(oai, worker):
    models = oai.models.list().data
    assert [(m.id, m.owned_by) for m in models] == [("tiny", "kvroute")]
    assert models[0].model_extra["max_model_len"] == 2048
    # the front door's body, as every kvroute front answers it
    assert httpx.get(f"{worker.base_url}/models", timeout=10).json() == {
        "object": "list", "data": [{"id": "tiny", "object": "model", "created": 0,
                                    "owned_by": "kvroute", "root": "tiny",
                                    "max_model_len": 2048}]}
    assert httpx.get(f"{worker.url}/health", timeout=10).json() == {"status": "ok"}
    assert httpx.get(f"{worker.url}/ready", timeout=10).json() == {"ready": True}


@pytest.mark.parametrize("body, status, param, code", [
    ({"model": "tiny", "prompt": "x", "n": 129}, 400, "n", "invalid_value"),
    ({"model": "tiny", "prompt": ["x"] * 65, "n": 2}, 400, "prompt", "invalid_value"),
    ({"model": "tiny", "prompt": ["x", [5]]}, 400, "prompt", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "logprobs": 21}, 400, "logprobs", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "min_tokens": 17}, 400, "min_tokens", "invalid_value"),
    ({"prompt": "x"}, 400, "model", "missing_required_parameter"),
    ({"model": "tiny", "prompt": "x", "temperature": -1}, 400, "temperature", "invalid_value"),
    ({"model": "tiny", "prompt": [], "max_tokens": 1}, 400, "prompt", "invalid_value"),
    ({"model": "tiny", "prompt": [70000]}, 400, None, "invalid_request"),  # outside the vocab
    ({"model": "tiny", "prompt": "x", "max_tokens": 5000}, 400, "prompt",
     "context_length_exceeded"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "model", "model_not_found"),
])
def test_bad_completions_are_openai_errors(worker, body, status, param, code):
    r = httpx.post(f"{worker.base_url}/completions", json=body, timeout=30)
    assert r.status_code == status
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
    assert error["type"] == "invalid_request_error" and error["message"]


def test_bad_requests_through_the_client_and_raw(oai, worker):
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="context length"):
        oai.chat.completions.create(model="tiny", max_tokens=4000,
                                    messages=[{"role": "user", "content": "x"}])
    r = httpx.post(f"{worker.base_url}/completions", content=b"{not json", timeout=10)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json")
    r = httpx.get(f"{worker.base_url}/nowhere", timeout=10)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    # the server goes on serving
    assert oai.completions.create(model="tiny", prompt="ok", max_tokens=1).usage


def test_metrics_have_vllm_gauges_and_engine_series(oai, worker):
    oai.completions.create(model="tiny", prompt="count me", max_tokens=3)
    samples = metric_samples(worker.url)
    for name in VLLM_GAUGES:
        assert samples[f"{name}{{engine=0,model_name=tiny}}"] >= 0
    assert samples["vllm:num_requests_running{engine=0,model_name=tiny}"] == 0
    labels = f"model=tiny,replica={_replica(samples)}"
    assert samples[f"kvroute_engine_generation_tokens_total{{{labels}}}"] >= 3


def _replica(samples: dict[str, float]) -> str:
    key = next(k for k in samples if k.startswith("kvroute_engine_prompt_tokens_total{"))
    return key.split("replica=")[1].rstrip("}")


@pytest.fixture(scope="module")
def slow_worker():
    w = EngineWorker.start(SLOW_SIM_ARGS)
    yield w
    assert w.stop() == 0


def test_a_stream_the_client_leaves_is_aborted(slow_worker):
    url = slow_worker.url
    before = num_aborted(url)
    body = {"model": "tiny", "prompt": "leave early", "max_tokens": 1500, "stream": True}
    with httpx.stream("POST", f"{slow_worker.base_url}/completions", json=body,
                      timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    # 1,500 tokens take ~12 s; the abort lands as soon as the server sees the disconnect
    wait_until(lambda: num_aborted(url) == before + 1, 10, "the stream's abort")
    gauge = "vllm:num_requests_running{engine=0,model_name=tiny}"
    assert metric_samples(url)[gauge] == 0


def test_a_non_streaming_request_the_client_leaves_is_aborted(slow_worker):
    url = slow_worker.url
    before = num_aborted(url)
    body = {"model": "tiny", "prompt": "give up waiting", "max_tokens": 1500}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{slow_worker.base_url}/completions", json=body, timeout=1.0)
    wait_until(lambda: num_aborted(url) == before + 1, 10, "the request's abort")


def test_sigterm_finishes_the_accepted_stream_then_exits_0():
    worker = EngineWorker.start(SLOW_SIM_ARGS)
    try:
        body = {"model": "tiny", "prompt": "finish me", "max_tokens": 200, "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{worker.base_url}/completions", json=body,
                          timeout=60) as r:
            lines = (line for line in r.iter_lines() if line)
            assert next(lines).startswith("data: {")
            worker.proc.terminate()  # SIGTERM while ~200 tokens are still to come
            rest = list(lines)
        assert rest[-1] == "data: [DONE]"
        assert '"completion_tokens":200' in rest[-2]
        assert worker.proc.wait(60) == 0
    finally:
        worker.kill()
