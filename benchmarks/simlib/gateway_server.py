"""`kvroute serve --workers ...` in a subprocess, for benchmarks: on a free port, ready when
every worker is up (and, when asked, routed on its KV events), stopped with its process
group (the local Ray instance it started)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.simlib.ray_head import RayHead
from benchmarks.simlib.servers import SLOW_BOX_ENV
from worker.ports import free_port

ROOT = Path(__file__).resolve().parents[2]




class GatewayServer:
    def __init__(self, workers: Sequence[str], args: Sequence[str], log_path: Path,
                 model: str = "tiny", address: str | None = None):
        self.port = free_port()
        self.model = model
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.num_workers = len(workers)
        kvroute = Path(sys.executable).with_name("kvroute")
        cmd = [str(kvroute), "serve", "--workers", ",".join(workers), "--model", model, *args,
               "--host", "127.0.0.1", "--port", str(self.port)]
        if address is not None:  # a shared local instance (benchmarks/simlib/ray_head.py)
            cmd += ["--address", address]
        self.log_path = log_path
        self._log = open(log_path, "w")
        # A crowded box can start Ray's agents slower than the raylet waits by default.
        env = {**os.environ, **SLOW_BOX_ENV}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=ROOT, env=env, start_new_session=True)

    def worker_modes(self) -> dict[str, str]:
        """Each worker's routing mode as this gateway exports it."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=30).text
        return {s.labels["replica"]: s.labels["mode"]
                for fam in text_string_to_metric_families(text) for s in fam.samples
                if s.name == "kvroute_router_worker_mode" and s.value == 1.0}

    def wait_ready(self, events: bool, timeout_s: float = 600.0) -> None:
        """Every worker up; with `events`, every worker routed on its KV events."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvroute serve exited with {self.proc.returncode}:\n"
                                   f"{self.log_path.read_text()[-3000:]}")
            try:
                ready = httpx.get(f"{self.base_url}/ready", timeout=5).json()
                # the counts: the workers' list is the admin key's to read
                if (ready["num_workers_up"] == self.num_workers
                        and (not events or self._all_on_events())):
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.5)  # polling a starting server, not synchronisation
        raise RuntimeError(f"kvroute serve was not ready in {timeout_s} s:\n"
                           f"{self.log_path.read_text()[-3000:]}")

    def _all_on_events(self) -> bool:
        # The mode is set at a routing decision: one tiny request refreshes it.
        httpx.post(f"{self.base_url}/v1/completions", timeout=60,
                   json={"model": self.model, "prompt": [40] * 8, "max_tokens": 1})
        modes = self.worker_modes()
        return len(modes) == self.num_workers and set(modes.values()) == {"events"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:  # what it left behind in its group (its local Ray instance)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._log.close()


def start_gateway(workers: Sequence[str], args: Sequence[str], log_path: Path, events: bool,
                  head: RayHead | None = None, attempts: int = 3) -> GatewayServer:
    """A ready server, joining `head` if given; a start that fails is tried again (on a
    crowded box a local Ray instance can miss its own startup deadline)."""
    for attempt in range(1, attempts + 1):
        server = GatewayServer(workers, args, log_path,
                               address=head.address if head is not None else None)
        try:
            server.wait_ready(events)
            return server
        except RuntimeError as err:
            stop_gateway(server, head)
            if attempt == attempts:
                raise
            print(f"kvroute serve failed to start (attempt {attempt}): {str(err)[-300:]}",
                  flush=True)
    raise AssertionError("unreachable")


def stop_gateway(server: GatewayServer, head: RayHead | None) -> None:
    """Stops the server and, in a shared instance, what it left there (Serve, kvroute's
    named actors), so the next server starts as on a fresh one."""
    server.stop()
    if head is not None:
        head.reset_serve()
