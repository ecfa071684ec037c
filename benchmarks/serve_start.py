"""Timing a server's start, for bench_real_model.py: from the process start until its HTTP
check passes, the CPU seconds its processes used by then, and the phases it printed."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
_PHASES = re.compile(r"^[\w-]+: up in [\d.]+ s \((.*)\)$")


def wait_until(proc: subprocess.Popen, ready: Callable[[], bool], timeout_s: float = 600.0
               ) -> None:
    """Until `ready()` (an HTTP check: httpx errors count as not yet); RuntimeError when the
    process exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[1]} exited with {proc.returncode}")
        try:
            if ready():
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)  # polling a starting server, not synchronisation
    raise RuntimeError(f"{proc.args[1]} not ready after {timeout_s:.0f} s")


def cpu_seconds(leader_pid: int) -> float:
    """CPU seconds (user + system) the live processes of `leader_pid`'s session and its
    descendants have used: on a 2-core box a start's wall time follows its CPU work."""
    import psutil

    procs = {p.pid: p for p in psutil.Process(leader_pid).children(recursive=True)}
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == leader_pid:
                procs.setdefault(proc.pid, proc)
        except (OSError, psutil.Error):
            pass
    total_s = 0.0
    for proc in [psutil.Process(leader_pid), *procs.values()]:
        try:
            times = proc.cpu_times()
            total_s += times.user + times.system
        except psutil.Error:
            pass
    return total_s


def start_phases(log_path: Path) -> dict[str, float]:
    """The phases a server printed once up (`kvroute: up in 9.9 s (ray 1.2 s, ...)`)."""
    for line in log_path.read_text(errors="replace").splitlines():
        match = _PHASES.match(line.strip())
        if match:
            return {name: float(value) for name, value in
                    (part.rsplit(" ", 2)[:2] for part in match.group(1).split(", "))}
    return {}


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's session, then SIGKILL if it is not gone in 2 minutes."""
    proc.terminate()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


def time_start(cmd: list[str], env: dict[str, str], log_path: Path,
               ready: Callable[[], bool]) -> dict:
    """Starts `cmd` (its own session, `env` over ours), waits for `ready`, stops it:
    {"s": seconds until ready, "cpu_s": CPU seconds by then, "phases": what it printed}."""
    with open(log_path, "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True, env={**os.environ, **env})
        try:
            wait_until(proc, ready)
            ready_s = time.perf_counter() - start
            cpu_s = cpu_seconds(proc.pid)
        finally:
            stop(proc)
    return {"s": round(ready_s, 1), "cpu_s": round(cpu_s, 1),
            "phases": start_phases(log_path)}
