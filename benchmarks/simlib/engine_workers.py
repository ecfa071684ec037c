"""Standalone `kvroute engine` servers as subprocesses, for benchmarks and tests.

Each worker binds a free port itself (`--port 0`) and prints the URL it serves once it
listens, so no port is guessed and none can be taken between choosing and binding it.
`stop()` sends SIGTERM (the server finishes accepted requests, then exits) and kills only
after a deadline.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

READY = re.compile(r"kvroute engine: serving '(?P<model>[^']*)' at (?P<url>http://\S+)/v1")
KV_EVENTS = re.compile(r"KV events \(vLLM format\) on (?P<endpoint>\S+), "
                       r"replay on (?P<replay>\S+),")
SIM_TINY_ARGS = ("--engine", "sim", "--sim-preset", "tiny")


class EngineWorker:
    """One `kvroute engine` subprocess; `base_url` ends in /v1, `url` is the server root;
    with --kv-events-port, `kv_events_endpoint` and `kv_events_replay_endpoint` are its ZMQ
    sockets."""

    def __init__(self, args: Sequence[str] = SIM_TINY_ARGS, host: str = "127.0.0.1"):
        """Starts the process; `wait_ready()` before using it (or use `start`)."""
        self.args = list(args)
        self._log = tempfile.NamedTemporaryFile(prefix="kvroute-engine-", suffix=".log",
                                                delete=False)
        kvroute = Path(sys.executable).with_name("kvroute")  # this environment's console script
        cmd = [str(kvroute), "engine", *self.args, "--host", host, "--port", "0"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self.url = self.base_url = self.model = ""
        self.kv_events_endpoint: str | None = None
        self.kv_events_replay_endpoint: str | None = None

    @classmethod
    def start(cls, args: Sequence[str] = SIM_TINY_ARGS, ready_timeout_s: float = 180.0
              ) -> EngineWorker:
        worker = cls(args)
        worker.wait_ready(ready_timeout_s)
        return worker

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Returns once the server listens; kills it and raises RuntimeError (with its log)
        when it exits or is not ready in time."""
        try:
            self.url, self.model = self._ready_line(timeout_s)
        except BaseException:
            self.kill()
            raise
        self.base_url = f"{self.url}/v1"

    def _ready_line(self, timeout_s: float) -> tuple[str, str]:
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        pending = b""
        # The pipe's bytes, not a buffered readline: the KV events line and the ready line
        # come out together, and a line left in a reader's buffer would wait for the next
        # select, which no further output ever wakes.
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    break
                data = os.read(fd, 65536)
                if not data:  # EOF: the process is gone
                    break
                *lines, pending = (pending + data).split(b"\n")
                for line in (raw.decode(errors="replace") for raw in lines):
                    events = KV_EVENTS.search(line)
                    if events:
                        self.kv_events_endpoint = events["endpoint"]
                        self.kv_events_replay_endpoint = events["replay"]
                    match = READY.search(line)
                    if match:
                        return match["url"], match["model"]
        raise RuntimeError(f"kvroute engine {' '.join(self.args)} did not become ready "
                           f"(exit status {self.proc.poll()}): {self.log_tail()}")

    def log_tail(self, num_chars: int = 2000) -> str:
        return Path(self._log.name).read_text(errors="replace")[-num_chars:]

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then wait (kill after `timeout_s`); the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def _close(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)


def start_engine_workers(num_workers: int, args: Sequence[str] = SIM_TINY_ARGS,
                         ready_timeout_s: float = 180.0) -> list[EngineWorker]:
    """`num_workers` workers, started together (their startups overlap), all ready."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    workers: list[EngineWorker] = []
    try:
        for _ in range(num_workers):
            workers.append(EngineWorker(args))
        for worker in workers:
            worker.wait_ready(ready_timeout_s)
    except BaseException:
        stop_all(workers)
        raise
    return workers


def stop_all(workers: Sequence[EngineWorker]) -> None:
    for worker in workers:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGTERM)
    for worker in workers:
        worker.stop()
