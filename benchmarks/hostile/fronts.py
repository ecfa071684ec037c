"""The three fronts a tenant can reach, started for real, each with what the harness reads of
it: its /metrics (the router's load per replica, the engines' errors) and its logs (engine
steps that failed).

- direct: `kvroute serve --engine sim` with direct ingress (HAProxy -> ingress router ->
  the engine replica's own HTTP app), 2 replicas, API keys, an admin key and a pin quota;
- engine: one `kvroute engine --engine sim` (no router, no keys: both tenants share it);
- workers: `kvroute serve --workers` in front of two `kvroute engine --engine sim` workers
  publishing their KV events, API keys and an admin key (for the worker admin API).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.hostile.client import SSL_CONTEXT
from benchmarks.simlib.engine_workers import SIM_TINY_ARGS, EngineWorker, stop_all
from benchmarks.simlib.gateway_server import GatewayServer, stop_gateway
from tests.router.serve.serve_helpers import wait_until

VICTIM_KEY, HOSTILE_KEY, ADMIN_KEY = "key-victim", "key-hostile", "admin-key-hostile-bench"
KEYS = {VICTIM_KEY: "victim", HOSTILE_KEY: "hostile"}
PIN_QUOTA_ENV = {"KVROUTE_PIN_MAX_NAMES_PER_TENANT": "2",
                 "KVROUTE_PIN_MAX_BLOCKS_PER_TENANT": "64"}
PIN_QUOTA_NAMES, PIN_QUOTA_BLOCKS = 2, 64
NUM_BLOCKS = 256  # per engine: a 4,096-token context
ENGINE_ARGS = (*SIM_TINY_ARGS, "--num-blocks", str(NUM_BLOCKS))
STEP_FAILED = "step failed"  # worker/engine/engine.py logs it for every engine step that raised


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass
class Front:
    name: str
    base_url: str
    victim_headers: dict[str, str]
    hostile_headers: dict[str, str]
    admin_headers: dict[str, str]
    engine_metrics_urls: list[str]  # every engine's series (the hub's, or each worker's)
    log_paths: list[Path]
    routed: bool  # a kvroute router sits in front: its load is read from /metrics
    workers: list[EngineWorker] = field(default_factory=list)

    def samples(self, url: str | None = None) -> list[tuple[str, dict, float]]:
        text = httpx.get(url or f"{self.base_url}/metrics", timeout=30,
                         verify=SSL_CONTEXT).text
        return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text)
                for s in fam.samples]

    def loads(self) -> dict[tuple[str, str], float]:
        """The load each router process weighs per replica, in tokens."""
        return {(ls.get("gateway", ""), ls.get("replica", "")): v
                for n, ls, v in self.samples() if n == "kvroute_router_load_tokens"}

    def miss_tokens(self) -> dict[str, float]:
        """Uncached prompt tokens the routers counted, by cause (router/core/miss_causes.py),
        summed over router processes."""
        out: dict[str, float] = {}
        for n, ls, v in self.samples():
            if n == "kvroute_miss_tokens_total":
                out[ls.get("cause", "")] = out.get(ls.get("cause", ""), 0.0) + v
        return out

    def outstanding_by_router(self) -> dict[tuple[str, str], float]:
        """The requests each router process counts outstanding per replica."""
        return {(ls.get("gateway", ""), ls.get("replica", "")): v
                for n, ls, v in self.samples() if n == "kvroute_router_outstanding_requests"}

    def engine_errors(self) -> float:
        """Requests the engines finished with "error" (a failed step fails all of its)."""
        return sum(v for url in self.engine_metrics_urls for n, ls, v in self.samples(url)
                   if n == "kvroute_engine_requests_finished_total"
                   and ls.get("reason") == "error")

    def step_failures(self) -> int:
        return self._count_in_logs(STEP_FAILED)

    def tracebacks(self) -> int:
        return self._count_in_logs("Traceback (most recent call last)")

    def _count_in_logs(self, text: str) -> int:
        return sum(p.read_text(errors="replace").count(text)
                   for p in self.log_paths if p.exists())


def nonfinite(loads: dict[tuple[str, str], float]) -> int:
    return sum(not math.isfinite(v) for v in loads.values())


@contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    """Variables the started servers inherit (a local Ray instance passes them on)."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _keys_file(workdir: Path) -> Path:
    keys = workdir / "keys.json"
    keys.write_text(json.dumps(KEYS))
    return keys


# The admin key goes by environment: the direct path's engine replicas read it only there
# (`--admin-key-file` reaches the gateways, and the replicas refuse to start without it).
ADMIN_ENV = {"KVROUTE_ADMIN_KEY": ADMIN_KEY}


@contextmanager
def direct_front(workdir: Path, replicas: int = 2) -> Iterator[Front]:
    from tests.router.serve.cli_server import kvroute_cli_server

    flags = ["--model", "tiny", "--ingress", "direct", "--engine", "sim", "--sim-preset",
             "tiny", "--num-blocks", str(NUM_BLOCKS), "--api-keys-file",
             str(_keys_file(workdir))]
    log = workdir / "serve-direct.log"
    with _environ({**PIN_QUOTA_ENV, **ADMIN_ENV}), kvroute_cli_server(
            flags, replicas, log, routed_probe=bearer(VICTIM_KEY)) as server:
        yield Front("direct", server.base_url, bearer(VICTIM_KEY), bearer(HOSTILE_KEY),
                    bearer(ADMIN_KEY), [f"{server.base_url}/metrics"], [log], routed=True)


@contextmanager
def engine_front(workdir: Path) -> Iterator[Front]:
    worker = EngineWorker.start(ENGINE_ARGS)
    log = workdir / "engine.log"
    try:
        yield Front("engine", worker.url, {}, {}, {}, [f"{worker.url}/metrics"],
                    [Path(worker._log.name)], routed=False, workers=[worker])
    finally:
        _keep_log(worker, log)
        worker.stop()


def _keep_log(worker: EngineWorker, to: Path) -> None:
    """The worker's log outlives it (EngineWorker deletes its own on stop)."""
    path = Path(worker._log.name)
    if path.exists():
        with open(to, "a") as out:
            out.write(path.read_text(errors="replace"))


@contextmanager
def workers_front(workdir: Path, num_workers: int = 2) -> Iterator[Front]:
    keys = _keys_file(workdir)
    workers = [EngineWorker([*ENGINE_ARGS, "--kv-events-port", "0"])
               for _ in range(num_workers)]
    gateway = None
    try:
        for w in workers:
            w.wait_ready()
        specs = [f"{w.url}#kv_events={w.kv_events_endpoint}"
                 f"&kv_replay={w.kv_events_replay_endpoint}" for w in workers]
        with _environ(ADMIN_ENV):
            gateway = GatewayServer(specs, ["--api-keys-file", str(keys)],
                                    workdir / "serve-workers.log")
        _wait_workers_up(gateway, num_workers)
        yield Front("workers", gateway.base_url, bearer(VICTIM_KEY), bearer(HOSTILE_KEY),
                    bearer(ADMIN_KEY), [f"{w.url}/metrics" for w in workers],
                    [Path(w._log.name) for w in workers] + [workdir / "serve-workers.log"],
                    routed=True, workers=workers)
    finally:
        if gateway is not None:
            stop_gateway(gateway, None)
        for i, w in enumerate(workers):
            _keep_log(w, workdir / f"worker-{i}.log")
        stop_all(workers)


def _wait_workers_up(gateway: GatewayServer, num_workers: int) -> None:
    """/ready counts every worker up (it names none to an unauthenticated caller), and the
    victim's completion is served."""
    def ready() -> bool:
        if gateway.proc.poll() is not None:
            raise RuntimeError(f"kvroute serve exited: {gateway.log_path.read_text()[-3000:]}")
        try:
            up = httpx.get(f"{gateway.base_url}/ready", timeout=5).json()
            served = httpx.post(f"{gateway.base_url}/v1/completions", timeout=30,
                                headers=bearer(VICTIM_KEY),
                                json={"model": "tiny", "prompt": "up?", "max_tokens": 1})
        except (httpx.HTTPError, ValueError):
            return False
        return up.get("num_workers_up") == num_workers and served.status_code == 200

    wait_until(ready, 300, "the workers gateway to serve", interval_s=0.5)


FRONTS = {"direct": direct_front, "engine": engine_front, "workers": workers_front}
