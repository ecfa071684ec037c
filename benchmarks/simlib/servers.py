"""Servers a benchmark starts in subprocesses: `kvroute serve`, `kvroute engine`, and the
trivial Ray Serve app of serve_floor.py. Each binds 127.0.0.1 on a free port, logs to a
file, is ready when its readiness URL says so, and is stopped with its process group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from worker.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
KVROUTE = str(ROOT / ".venv" / "bin" / "kvroute")
PYTHON = str(ROOT / ".venv" / "bin" / "python")
# Every server's environment: on a crowded box the raylet gives up waiting for its agents
# (30 s by default) and Serve kills a proxy not ready within 5 s, so give them longer; and
# a process that joins a local instance by address authenticates with this host's token
# (~/.ray/auth_token) only when told to.
SLOW_BOX_ENV = {"RAY_agent_register_timeout_ms": "180000",
                "RAY_raylet_start_wait_time_s": "180", "RAY_AUTH_MODE": "token",
                "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
                "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
                "RAY_SERVE_HAPROXY_STARTUP_TIMEOUT_S": "120"}




class ServerProcess:
    """One server subprocess (its own session, so stop() ends its whole group)."""

    def __init__(self, name: str, cmd: list[str], port: int, log_path: Path,
                 is_ready: Callable[[str], bool], env: dict[str, str] | None = None):
        self.name = name
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._is_ready = is_ready
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, **SLOW_BOX_ENV, **(env or {})},
                                     start_new_session=True)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; the end "
                                   f"of its log:\n{self.log_tail()}")
            try:
                if self._is_ready(self.base_url):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)  # polling a starting server, not synchronisation
        raise RuntimeError(f"{self.name} was not ready after {timeout_s} s; the end of its "
                           f"log:\n{self.log_tail()}")

    def log_tail(self, num_chars: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def stop(self, timeout_s: float = 120.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:  # whatever the server left behind in its group (Ray's local processes)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._log.close()


def start(factory: Callable[[], ServerProcess], attempts: int = 5,
          after_failure: Callable[[], None] | None = None) -> ServerProcess:
    """A started, ready server; a start that fails is tried again (on a crowded box a local
    Ray instance can miss its own 30 s startup deadline), after `after_failure()` cleared
    what it left (Serve in a shared Ray instance)."""
    for attempt in range(attempts):
        server = factory()
        try:
            server.wait_ready()
            return server
        except RuntimeError as err:
            server.stop()
            if after_failure is not None:
                after_failure()
            if attempt == attempts - 1:
                raise
            print(f"{server.name} failed to start, trying again: {str(err)[-300:]}",
                  flush=True)
    raise AssertionError("unreachable")


def _replicas_ready(num_replicas: int) -> Callable[[str], bool]:
    def check(base_url: str) -> bool:
        ready = httpx.get(f"{base_url}/ready", timeout=5).json()
        return len(ready.get("replicas", [])) == num_replicas
    return check


def _answers_models(base_url: str) -> bool:
    return httpx.get(f"{base_url}/v1/models", timeout=5).status_code == 200


def kvroute_serve(args: list[str], log_path: Path, num_replicas: int,
                  env: dict[str, str] | None = None, address: str | None = None
                  ) -> ServerProcess:
    """`kvroute serve ARGS --replicas N` on a free port (joining `address` if given)."""
    port = free_port()
    cmd = [KVROUTE, "serve", *args, "--replicas", str(num_replicas),
           "--host", "127.0.0.1", "--port", str(port)]
    if address is not None:
        cmd += ["--address", address]
    return ServerProcess("kvroute serve", cmd, port, log_path,
                         _replicas_ready(num_replicas), env)


def standalone_engine_available() -> bool:
    """Whether this checkout has `kvroute engine` (the standalone OpenAI server)."""
    out = subprocess.run([KVROUTE, "engine", "--help"], capture_output=True, cwd=ROOT)
    return out.returncode == 0


def kvroute_engine(args: list[str], log_path: Path) -> ServerProcess:
    """`kvroute engine ARGS` (one replica, standalone) on a free port."""
    port = free_port()
    cmd = [KVROUTE, "engine", *args, "--host", "127.0.0.1", "--port", str(port)]
    return ServerProcess("kvroute engine", cmd, port, log_path, _answers_models)


def serve_floor(log_path: Path, mode: str, env: dict[str, str] | None = None,
                address: str | None = None) -> ServerProcess:
    """The trivial Ray Serve app (benchmarks/simlib/serve_floor.py) on a free port; mode
    `1hop`, `2hop` or `direct` (HAProxy and an ingress request router, env set here)."""
    port = free_port()
    cmd = [PYTHON, "-m", "benchmarks.simlib.serve_floor", "--port", str(port)]
    if address is not None:
        cmd += ["--address", address]
    if mode == "direct":
        cmd.append("--direct")
        env = {**(env or {}), "RAY_SERVE_ENABLE_HA_PROXY": "1",
               "RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY": "1",
               "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
               "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port())}
    else:
        cmd += ["--hops", mode[0]]
    return ServerProcess("serve floor app", cmd, port, log_path, _answers_models, env)
