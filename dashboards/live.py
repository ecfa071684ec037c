"""A live metrics stack on loopback: a real Prometheus scraping a running kvroute.

Used by tests/deploy/test_dashboard_queries.py (every panel's query against real series) and
by dashboards/render.py (PNGs of the main panels). Waits poll an observable condition with a
deadline; nothing sleeps in place of synchronisation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx
import yaml

from worker.ports import free_port

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
RULE_FILES = (REPO / "dashboards" / "rules" / "kvroute.rules.yaml",)
POLL_INTERVAL_S = 0.2




def wait_until(probe: Callable[[], T | None], timeout_s: float, what: str,
               process: subprocess.Popen | None = None) -> T:
    """Polls `probe` until it returns something other than None and returns that.

    Raises TimeoutError after `timeout_s`, or RuntimeError at once if `process` exits.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result is not None:
            return result
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: process exited with code {process.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout_s:.0f} s")
        time.sleep(POLL_INTERVAL_S)


def _get_or_none(client: httpx.Client, url: str) -> httpx.Response | None:
    try:
        response = client.get(url)
    except httpx.TransportError:
        return None
    return response if response.status_code == 200 else None


def _stop(process: subprocess.Popen, timeout_s: float) -> None:
    """SIGINT the process, then SIGKILL its process group if it has not exited within
    `timeout_s`. Only the leader gets the SIGINT: `kvroute serve` then shuts Serve down in
    order (HAProxy included), which a SIGINT to every Ray process of the group at once
    broke, leaving HAProxy running after the test."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _tail(path: Path, num_chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-num_chars:] if path.exists() else ""


class PrometheusError(RuntimeError):
    """Prometheus rejected a query (bad_data: it does not parse) or failed to run it."""


class PrometheusAPI:
    """A client of Prometheus's HTTP API at `url`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(base_url=url, timeout=30.0)

    def _api(self, path: str, params: dict) -> dict:
        response = self.client.get(f"/api/v1/{path}", params=params)
        body = response.json()
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')} "
                                  f"(query: {params.get('query', params)})")
        return body["data"]

    def query(self, expr: str, at_s: float | None = None) -> list[tuple[dict, float]]:
        """Instant query: (labels, value) per series; a scalar result is one series, no labels."""
        params = {"query": expr} if at_s is None else {"query": expr, "time": at_s}
        data = self._api("query", params)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(item["metric"], float(item["value"][1])) for item in data["result"]]

    def query_range(self, expr: str, start_s: float, end_s: float,
                    step_s: float) -> list[tuple[dict, list[float], list[float]]]:
        """Range query: (labels, times_s, values) per series; NaN points are kept as NaN."""
        data = self._api("query_range",
                         {"query": expr, "start": start_s, "end": end_s, "step": step_s})
        return [(item["metric"], [float(t) for t, _ in item["values"]],
                 [float(v) for _, v in item["values"]]) for item in data["result"]]

    def label_values(self, label: str, match: str) -> list[str]:
        return self._api(f"label/{label}/values", {"match[]": match})

    def rule_health(self) -> dict[str, str]:
        """Rule name -> health ("ok", "err", "unknown") of every loaded rule."""
        groups = self._api("rules", {})["groups"]
        return {rule["name"]: rule["health"] for group in groups for rule in group["rules"]}

    def close(self) -> None:
        self.client.close()


class Prometheus(PrometheusAPI):
    """A real Prometheus on 127.0.0.1 scraping `targets` every second.

    Args:
        binary: the prometheus executable.
        workdir: an empty directory for the config, the TSDB and the log.
        targets: host:port of each /metrics endpoint to scrape (job "kvroute").
        rule_files: rule files to load and evaluate every second.
    """

    def __init__(self, binary: str, workdir: Path, targets: Sequence[str],
                 rule_files: Sequence[Path] = RULE_FILES) -> None:
        self.port = free_port()
        super().__init__(f"http://127.0.0.1:{self.port}")
        self.log_path = workdir / "prometheus.log"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [{
                "job_name": "kvroute",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": list(targets)}],
            }],
        }
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={config_path}",
                 f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        try:
            wait_until(lambda: _get_or_none(self.client, "/-/ready"), timeout_s,
                       "prometheus ready", self.process)
        except (TimeoutError, RuntimeError) as error:
            raise RuntimeError(f"{error}\n{_tail(self.log_path)}") from error

    def wait_for_scrape(self, timeout_s: float = 30.0) -> None:
        """Waits until every target has been scraped successfully at least once."""
        def all_up() -> bool | None:
            samples = self.query('up{job="kvroute"}')
            return True if samples and all(value == 1 for _, value in samples) else None

        wait_until(all_up, timeout_s, "every target scraped", self.process)

    def wait_for_requests(self, num_requests: int, timeout_s: float = 30.0) -> None:
        """Waits until engines and routers have counted `num_requests` finished requests, and
        one more scrape has followed: every series then has a sample from after the load."""
        counted = (f"sum(kvroute_engine_requests_finished_total) >= {num_requests} "
                   f"and sum(kvroute_router_requests_total) >= {num_requests}")
        wait_until(lambda: self.query(counted) or None, timeout_s,
                   f"{num_requests} requests scraped", self.process)
        counted_at_s = time.time()
        later_scrape = f'timestamp(up{{job="kvroute"}}) > {counted_at_s:.3f}'
        wait_until(lambda: self.query(later_scrape) or None, timeout_s,
                   "one more scrape", self.process)

    def stop(self) -> None:
        self.close()
        _stop(self.process, timeout_s=10.0)


class KvrouteSim:
    """`kvroute serve --engine sim` on 127.0.0.1: the real gateway, router and metrics with
    simulated engine replicas.

    Args:
        kvroute_bin: the `kvroute` console script.
        workdir: a directory for the server's log.
        num_replicas: engine replicas.
        extra_args: more `kvroute serve` flags, e.g. ("--num-host-blocks", "4096").
    """

    def __init__(self, kvroute_bin: str, workdir: Path, num_replicas: int = 2,
                 extra_args: Sequence[str] = ()) -> None:
        self.num_replicas = num_replicas
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.target = f"127.0.0.1:{self.port}"
        self.log_path = workdir / "kvroute.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [kvroute_bin, "serve", "--engine", "sim", "--model", "tiny",
                 "--replicas", str(num_replicas), "--host", "127.0.0.1",
                 "--port", str(self.port), *extra_args],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir)
        self.client = httpx.Client(base_url=self.url, timeout=30.0)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Waits until /ready reports every engine replica (Ray starts first: slow)."""
        def all_replicas_ready() -> bool | None:
            response = _get_or_none(self.client, "/ready")
            if response is None or len(response.json()["replicas"]) < self.num_replicas:
                return None
            return True

        try:
            wait_until(all_replicas_ready, timeout_s, "kvroute serve --engine sim ready",
                       self.process)
        except (TimeoutError, RuntimeError) as error:
            raise RuntimeError(f"{error}\n{_tail(self.log_path)}") from error

    def stop(self) -> None:
        self.client.close()
        _stop(self.process, timeout_s=90.0)  # Serve's graceful shutdown takes ~40 s


def shared_prefix_prompts(num_prefixes: int, requests_per_prefix: int,
                          prefix_chars: int = 512, seed: int = 0) -> list[str]:
    """Prompts in groups that share a long prefix (a system prompt) and differ at the end.

    Ordered round-robin over groups, so each group's first request comes early and the
    group's later requests can hit its cached prefix.
    """
    words = ("cache", "route", "block", "token", "replica", "prefix", "tensor", "kernel")
    prefixes = [
        f"System {group}: " + " ".join(words[(group * 7 + k * 3 + seed) % len(words)]
                                        for k in range(prefix_chars // 6))
        for group in range(num_prefixes)
    ]
    return [f"{prefixes[group]}\nUser question {index}: what is {group * 100 + index}?"
            for index in range(requests_per_prefix) for group in range(num_prefixes)]


def send_completions(base_url: str, prompts: Sequence[str], model: str = "tiny",
                     max_tokens: int = 8, concurrency: int = 4) -> int:
    """POSTs each prompt to /v1/completions, `concurrency` at a time; returns how many got 200.

    Raises RuntimeError on the first non-200 answer, with its body.
    """
    with httpx.Client(base_url=base_url, timeout=60.0) as client:
        def complete(prompt: str) -> int:
            response = client.post("/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0.0})
            if response.status_code != 200:
                raise RuntimeError(f"/v1/completions -> {response.status_code}: "
                                   f"{response.text[:500]}")
            return 1

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return sum(pool.map(complete, prompts))

