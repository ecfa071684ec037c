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


def cpu_seconds(leader_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) the live processes of `leader_pid`'s session and its
    descendants have used, by process title (`ray::ServeController`, `raylet`, ...): on a
    2-core box a start's wall time follows its CPU work."""
    import psutil

    procs = {p.pid: p for p in psutil.Process(leader_pid).children(recursive=True)}
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == leader_pid:
                procs.setdefault(proc.pid, proc)
        except (OSError, psutil.Error):
            pass
    by_title: dict[str, float] = {}
    for proc in [psutil.Process(leader_pid), *procs.values()]:
        try:
            times, cmdline = proc.cpu_times(), proc.cmdline()
        except psutil.Error:
            continue
        title = _title(cmdline) if proc.pid != leader_pid else "driver"
        by_title[title] = by_title.get(title, 0.0) + times.user + times.system
    return by_title


def _title(cmdline: list[str]) -> str:
    if not cmdline:
        return "?"
    if cmdline[0].startswith("ray::"):  # an actor or task: its class and method
        return cmdline[0].split(".")[0].removeprefix("ray::")
    script = next((Path(arg).stem for arg in cmdline[1:2] if arg.endswith(".py")), None)
    return script or Path(cmdline[0]).name


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
               ready: Callable[[], bool], phases_wait_s: float = 30.0) -> dict:
    """Starts `cmd` (its own session, `env` over ours), waits for `ready`, stops it:
    {"s": seconds until ready, "cpu_s": CPU seconds its processes used by then,
    "cpu_by_process": the same by process title, "phases": the phases it printed (waited
    for up to `phases_wait_s` after ready: `kvroute serve` prints them once Serve reports
    the app running, which can come after the app answers)}."""
    with open(log_path, "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True, env={**os.environ, **env})
        try:
            wait_until(proc, ready)
            ready_s = time.perf_counter() - start
            by_process = cpu_seconds(proc.pid)
            try:
                wait_until(proc, lambda: bool(start_phases(log_path)), phases_wait_s)
            except RuntimeError:
                pass  # not printed: the phases stay unknown
        finally:
            stop(proc)
    top = sorted(by_process.items(), key=lambda item: -item[1])
    return {"s": round(ready_s, 1), "cpu_s": round(sum(by_process.values()), 1),
            "cpu_by_process": {title: round(cpu_s, 1) for title, cpu_s in top},
            "phases": start_phases(log_path), "replicas": replica_lines(log_path)}


def replica_lines(log_path: Path) -> list[str]:
    """What each engine replica printed once up (Ray streams it to the driver's log)."""
    return [line[line.index("engine replica"):].strip()
            for line in log_path.read_text(errors="replace").splitlines()
            if "kvroute: engine replica" in line]
