"""`kvroute serve` in a subprocess, as a user starts it: its own local Ray, its Serve
environment (router/serve/serve_env.py) set by the CLI before Ray Serve is imported, which
a test process that imported Ray Serve already cannot do for itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from router.cli import APP_NAME
from router.serve.route_tracking import ROUTED_BY_HEADER
from tests.router.serve.serve_helpers import Server, free_port, wait_until

KVROUTE = str(Path(sys.executable).with_name("kvroute"))


@dataclass
class CLIServer(Server):
    pid: int = 0  # the CLI's

    def kill_an_engine_replica(self) -> int:
        """SIGKILLs one engine replica process of this server (a crash, as Ray sees it):
        a process titled as an EngineReplica whose ancestors include the CLI (its local
        Ray instance's raylet starts the workers). Returns its pid."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if f"{APP_NAME}:EngineReplica".encode() in cmdline and self._descends(int(entry)):
                os.kill(int(entry), signal.SIGKILL)
                return int(entry)
        raise LookupError(f"no engine replica process under pid {self.pid}")

    def _descends(self, pid: int) -> bool:
        for _ in range(8):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return False
            pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent pid
            if pid == self.pid:
                return True
            if pid <= 1:
                return False
        return False


def _ready(base_url: str, num_replicas: int, routed_probe: dict[str, str] | None,
           seen: list[str]) -> bool:
    """/ready lists every replica, and with `routed_probe` (request headers) a completion
    says a router routed it (ingress direct: HAProxy takes the ingress request router into
    its config some time after the replicas answer). What the last probe saw goes in
    `seen`, for the error when the server never gets there."""
    try:
        body = httpx.get(f"{base_url}/ready", timeout=5).json()
        if len(body.get("replicas", [])) != num_replicas:
            seen[:] = [f"/ready: {str(body)[:300]}"]
            return False
        if routed_probe is None:
            return True
        resp = httpx.post(f"{base_url}/v1/completions", timeout=30, headers=routed_probe,
                          json={"model": "tiny", "prompt": "ready?", "max_tokens": 1})
    except (httpx.HTTPError, ValueError) as err:
        seen[:] = [f"probe failed: {err!r}"]
        return False
    seen[:] = [f"completion: {resp.status_code}, headers {dict(resp.headers)}, "
               f"body {resp.text[:300]}"]
    return resp.status_code == 200 and ROUTED_BY_HEADER in resp.headers


@contextmanager
def kvroute_cli_server(flags: list[str], num_replicas: int, log_path: Path,
                       attempts: int = 3,
                       routed_probe: dict[str, str] | None = None) -> Iterator[CLIServer]:
    """`kvroute serve FLAGS --replicas N` on a free port; stopped (SIGTERM, then its whole
    process group) on exit. A start that fails (a crowded box can make the local Ray
    instance miss its own startup deadline) is tried again."""
    failures: list[str] = []
    for attempt in range(attempts):
        port = free_port()
        cmd = [KVROUTE, "serve", *flags, "--replicas", str(num_replicas),
               "--host", "127.0.0.1", "--port", str(port)]
        log = open(log_path, "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=dict(os.environ))
        base_url = f"http://127.0.0.1:{port}"
        seen: list[str] = []
        try:
            wait_until(lambda p=proc, u=base_url, s=seen: (
                p.poll() is not None or _ready(u, num_replicas, routed_probe, s)),
                300, "kvroute serve to come up")
            if proc.poll() is None:
                break
        except AssertionError:
            pass
        exited = proc.poll() is not None
        _stop(proc)
        log.close()
        failures.append(f"attempt {attempt}: " + (
            f"exited with {proc.returncode}, its log ending {log_path.read_text()[-300:]!r}"
            if exited else f"not ready in 300 s; the last probe saw {seen}"))
        if attempt == attempts - 1:
            raise RuntimeError(f"kvroute serve did not start ({'; '.join(failures)}); "
                               f"its log ends with:\n{log_path.read_text()[-3000:]}")
    try:
        yield CLIServer(base_url, {"replicas": num_replicas}, proc.pid)
    finally:
        _stop(proc)
        log.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pass
    try:  # what it left behind in its group: its local Ray instance's processes
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
