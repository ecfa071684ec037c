"""Shared pieces of the Serve tests: one local Ray + kvroute app per test module."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray import serve

from router.apps.build import build_app
from router.cli import APP_NAME
from worker.ports import free_port


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str,
               interval_s: float = 0.1) -> Any:
    """Polls an eventually-true condition (asynchronous convergence) up to a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


@dataclass
class Server:
    base_url: str
    args: dict

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=kw.pop("timeout", 60.0), **kw)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """The /metrics exposition as {(sample name, sorted labels): value}."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=30).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def sum_metric(self, name: str, **labels: str) -> float:
        return sum(v for (n, ls), v in self.metrics().items()
                   if n == name and all(dict(ls).get(k) == want for k, want in labels.items()))

    def by_label(self, name: str, label: str, **labels: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (n, ls), v in self.metrics().items():
            d = dict(ls)
            if n == name and all(d.get(k) == want for k, want in labels.items()):
                out[d[label]] = out.get(d[label], 0.0) + v
        return out

    def replica_ids(self) -> list[str]:
        return httpx.get(f"{self.base_url}/ready", timeout=30).json()["replicas"]


@contextmanager
def kvroute_server(args: dict, num_cpus: int = 2) -> Iterator[Server]:
    """Local Ray, Serve on a free port, the kvroute app (ingress gateway unless `args` says:
    this process's Ray has no HAProxy environment); torn down on exit."""
    args = {"ingress": "gateway", **args}
    port = free_port()
    ray.init(num_cpus=num_cpus, include_dashboard=False, namespace="serve",
             object_store_memory=128 * 1024**2, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(args), name=APP_NAME, route_prefix="/")
        server = Server(f"http://127.0.0.1:{port}", args)
        wait_until(lambda: len(server.replica_ids()) == args.get("replicas", 2), 120,
                   "every engine replica to publish to the index")
        yield server
    finally:
        serve.shutdown()
        ray.shutdown()


@contextmanager
def prometheus_scraping(target: str, workdir) -> Iterator[str]:
    """A real Prometheus (Debian package) scraping `target` (host:port) every second;
    yields its base URL."""
    import shutil
    import subprocess

    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed: run tests/setup_system.sh")
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: kvroute\n    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: ['{target}']\n")
    log = open(workdir / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={config}",
                             f"--storage.tsdb.path={workdir / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


DELIVERED = ("sum by (replica) (rate(kvroute_engine_prefix_cache_hit_tokens_total[5m])) / "
             "sum by (replica) (rate(kvroute_engine_prefix_cache_query_tokens_total[5m]))")
PREDICTED = ("sum by (replica) (rate(kvroute_router_predicted_hit_tokens_total[5m])) / "
             "sum by (replica) (rate(kvroute_router_prompt_tokens_total[5m]))")

# What tells two series of one counter apart: the router's are per ingress router too.
SERIES_LABELS = ("replica", "medium", "gateway")


def promql(base_url: str, query: str, at: float | None = None) -> dict[tuple, float]:
    """An instant query, evaluated now or at unix time `at`: {sorted labels: value}."""
    params = {"query": query} if at is None else {"query": query, "time": f"{at:.3f}"}
    try:
        resp = httpx.get(f"{base_url}/api/v1/query", params=params, timeout=10)
    except httpx.TransportError:
        return {}
    data = resp.json()["data"]["result"] if resp.status_code == 200 else []
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in data}


LATENCY_STAGES = ("preprocess", "queue", "ttft", "tpot", "e2e")


def latency_counts(server: Server, stages: tuple[str, ...] = LATENCY_STAGES
                   ) -> dict[str, float]:
    """How many requests each gateway latency histogram has observed (every front process)."""
    return {stage: server.sum_metric(f"kvroute_gateway_{stage}_seconds_count")
            for stage in stages}


def send_timed_requests(oai) -> int:
    """One non-streamed completion, one streamed, one chat: each finishes after 4 tokens.
    Returns how many were sent."""
    oai.completions.create(model="tiny", prompt="Time me, please.", max_tokens=4,
                           extra_body={"ignore_eos": True})
    chunks = list(oai.completions.create(model="tiny", prompt="Time my stream.", max_tokens=4,
                                         stream=True, extra_body={"ignore_eos": True}))
    assert chunks[-1].choices[0].finish_reason == "length"
    oai.chat.completions.create(model="tiny", max_tokens=4, extra_body={"ignore_eos": True},
                                messages=[{"role": "user", "content": "Time my chat."}])
    return 3


def assert_latency_histograms_count_each_request(server: Server, oai) -> None:
    """Sends `send_timed_requests` and waits until every gateway latency histogram has
    observed each of them once (docs/metrics.md, "Gateway latency")."""
    before = latency_counts(server)
    sent = send_timed_requests(oai)
    want = {stage: count + sent for stage, count in before.items()}
    wait_until(lambda: latency_counts(server) == want, 30,
               f"every latency histogram to count {sent} more requests")


def assert_model_list(base_url: str, api_key: str) -> None:
    """/v1/models is the front door's body, as `kvroute engine` answers it: the model with
    its context length (the one /tokenize reports)."""
    headers = {"Authorization": f"Bearer {api_key}"}
    listed = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30).json()
    tokens = httpx.post(f"{base_url}/tokenize", json={"prompt": "x"}, headers=headers,
                        timeout=30).json()
    assert tokens["max_model_len"] > 0
    assert listed == {"object": "list", "data": [{
        "id": "tiny", "object": "model", "created": 0, "owned_by": "kvroute", "root": "tiny",
        "max_model_len": tokens["max_model_len"]}]}
