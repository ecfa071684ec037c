"""The routers bench_peers.py compares, each started in front of the same fresh workers.

- none: no router; the client round-robins over the workers itself.
- kvroute_events / kvroute_approximate: `kvroute serve --workers` (cache_aware) on the
  workers' vLLM-format KV events, or on its own routed history (`--approximate`).
- sglang_cache_aware: sglang-router (`sglang-router launch --policy cache_aware`).
- vllm_cache_aware / vllm_kv_aware: vllm-router, the second on the same ZMQ KV events.
- kvroute_round_robin / vllm_round_robin: each front with a trivial policy, for what the
  front itself adds to TTFT (against `none`); no hit-rate target reads them.

The peers run from a venv of their own (.cache/peers-venv), installed from PyPI the first
time: they are no kvroute dependency, and nothing but this benchmark needs them. Their
settings are their defaults (cache threshold 0.3, balance thresholds 64 / 1.5).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.simlib.engine_workers import EngineWorker
from benchmarks.simlib.gateway_server import GatewayServer, start_gateway, stop_gateway
from benchmarks.simlib.ray_head import RayHead
from benchmarks.simlib.servers import ROOT, ServerProcess, free_port
from kv.hashing import DEFAULT_BLOCK_SIZE

ROUTERS = ("none", "kvroute_events", "kvroute_approximate", "sglang_cache_aware",
           "vllm_cache_aware", "vllm_kv_aware", "kvroute_round_robin", "vllm_round_robin")
KVROUTE = ("kvroute_events", "kvroute_approximate", "kvroute_round_robin")
PEERS = ("sglang_cache_aware", "vllm_cache_aware", "vllm_kv_aware")  # the hit-rate rivals
PEER_PROCESSES = (*PEERS, "vllm_round_robin")  # the routers run from the peers' venv
PEERS_VENV = ROOT / ".cache" / "peers-venv"
PEER_PACKAGES = ("sglang-router==0.3.2", "vllm-router==0.1.17")
MODEL = "tiny"
BLOCK_SIZE = DEFAULT_BLOCK_SIZE


def ensure_peers() -> dict[str, str]:
    """Installs the peers into their venv if missing; their versions."""
    pip = PEERS_VENV / "bin" / "pip"
    if not all((PEERS_VENV / "bin" / b).exists() for b in ("sglang-router", "vllm-router")):
        if not pip.exists():
            # the system's python, not kvroute's venv: the peers share none of its packages
            subprocess.run(["python3", "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(pip), "install", "-q", *PEER_PACKAGES], check=True)
    out = subprocess.run([str(pip), "list", "--format", "freeze"], capture_output=True,
                         text=True, check=True).stdout
    return {k: v for k, _, v in (line.partition("==") for line in out.splitlines())
            if k in ("sglang-router", "vllm-router")}


def peer_command(name: str, workers: Sequence[EngineWorker]) -> list[str]:
    urls = [w.url for w in workers]
    bin_dir = PEERS_VENV / "bin"
    if name == "sglang_cache_aware":
        return [str(bin_dir / "sglang-router"), "launch", "--policy", "cache_aware",
                "--worker-urls", *urls]
    if name in ("vllm_cache_aware", "vllm_round_robin"):
        policy = name.removeprefix("vllm_")
        return [str(bin_dir / "vllm-router"), "--policy", policy, "--worker-urls", *urls]
    if name == "vllm_kv_aware":
        cmd = [str(bin_dir / "vllm-router"), "--policy", "kv_aware", "--worker-urls", *urls,
               "--kv-event-block-size", str(BLOCK_SIZE), "--kv-event-model", MODEL]
        for w in workers:
            cmd += ["--kv-event-source", f"{w.url}={w.kv_events_endpoint}",
                    "--kv-event-replay-source", f"{w.url}={w.kv_events_replay_endpoint}"]
        return cmd
    raise ValueError(f"{name!r} is not a peer router; choose one of {PEER_PROCESSES}")


def _answers_completion(base_url: str) -> bool:
    """A peer is ready once it forwards a completion (a tiny prompt no workload uses)."""
    r = httpx.post(f"{base_url}/v1/completions", timeout=10,
                   json={"model": MODEL, "prompt": "~" * 8, "max_tokens": 1})
    return r.status_code == 200


@dataclass
class RunningRouter:
    name: str
    base_url: str | None  # None: the client round-robins over the workers
    _gateway: GatewayServer | None = None
    _peer: ServerProcess | None = None
    _head: RayHead | None = None

    def stop(self) -> None:
        if self._gateway is not None:
            stop_gateway(self._gateway, self._head)
        if self._peer is not None:
            self._peer.stop(timeout_s=20)


def start_router(name: str, workers: Sequence[EngineWorker], num_blocks: int, log_dir: Path,
                 head: RayHead | None, num_gateways: int = 1,
                 continuation_affinity: bool = False) -> RunningRouter:
    """`num_gateways`: kvroute serve's gateway processes, and `continuation_affinity`, given
    explicitly so that a run says what it measured whatever the default is (sim_vs_live.py
    replays the same)."""
    if name == "none":
        return RunningRouter(name, None)
    if name in KVROUTE:
        events = name == "kvroute_events"
        if events:
            targets = [f"{w.url}#kv_events={w.kv_events_endpoint}"
                       f"&kv_replay={w.kv_events_replay_endpoint}" for w in workers]
            flags = []
        elif name == "kvroute_round_robin":
            targets, flags = [w.url for w in workers], ["--policy", "round_robin"]
        else:
            targets, flags = [w.url for w in workers], ["--approximate"]
        # routed history assumes each worker caches what its pool holds
        flags += ["--num-blocks", str(num_blocks), "--gateways", str(num_gateways),
                  "--continuation-affinity" if continuation_affinity
                  else "--no-continuation-affinity"]
        gateway = start_gateway(targets, flags, log_dir / f"{name}.log", events=events,
                                head=head)
        return RunningRouter(name, gateway.base_url, _gateway=gateway, _head=head)
    port = free_port()
    proc = ServerProcess(name, [*peer_command(name, workers), "--host", "127.0.0.1",
                                "--port", str(port)], port, log_dir / f"{name}.log",
                         _answers_completion)
    try:
        proc.wait_ready(timeout_s=120)
    except RuntimeError:
        proc.stop(timeout_s=10)
        raise
    return RunningRouter(name, proc.base_url, _peer=proc)
