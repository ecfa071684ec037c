"""One local Ray instance for a whole benchmark run, which each server joins in turn.

On a crowded box a local Ray instance often misses its own startup deadlines (the raylet
waits about 15 s for its dashboard agent): starting one instance per server multiplies the
failures. `RayHead` starts one (again until it comes up), and
`reset_serve` clears what a server left in it (Serve, kvroute's named actors) so the next
server starts as on a fresh instance, Serve's environment included.
"""

from __future__ import annotations

import os
import re
import subprocess

from benchmarks.simlib.servers import PYTHON, ROOT, SLOW_BOX_ENV, ServerProcess, free_port

# `ray start` (its CLI, in this process) with the node's registration awaited for up to
# 5 minutes instead of 30 s (on a crowded box the raylet registers late, not never) and the
# dashboard agent in its minimal mode.
_START = """
import sys, time
import ray._private.services as services
import ray._private.utils
from ray.scripts.scripts import cli

_get_node = services.get_node


def patient_get_node(*args, **kwargs):
    deadline = time.monotonic() + 300
    while True:
        try:
            return _get_node(*args, **kwargs)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


services.get_node = patient_get_node
# The dashboard agent's minimal mode (what Ray runs without ray[default]'s extras): it
# starts in a fraction of the time, and the raylet gives up on an agent that has not
# reported its port within ~15 s.
ray._private.utils.get_dashboard_dependency_error = lambda: "minimal agent, for a crowded box"
cli(["start", *sys.argv[1:]])
"""

_RESET = """
import sys, ray
from ray import serve
ray.init(address=sys.argv[1], namespace="serve", log_to_driver=False)
serve.shutdown()
for name in ("kvroute-index", "kvroute-metrics"):
    try:
        ray.kill(ray.get_actor(name, namespace="kvroute"), no_restart=True)
    except ValueError:
        pass
"""


def _address_of(log_text: str) -> str | None:
    """The GCS address `ray start` prints once the head is up."""
    m = re.search(r"--address='([^']+)'", log_text)
    return m.group(1) if m else None


class RayHead:
    """A local Ray instance with `num_cpus` CPUs, up until `stop()`.

    `ray start --head --block` with every agent port given (the raylet then does not wait
    for its agents to report their ports, a wait that times out on a crowded box) and the
    node's registration awaited patiently."""

    def __init__(self, log_dir, num_cpus: int = 2, attempts: int = 8):
        for attempt in range(attempts):
            gcs_port = free_port()
            cmd = [PYTHON, "-c", _START, "--head", "--block", "--port", str(gcs_port),
                   "--num-cpus", str(num_cpus), "--include-dashboard", "false",
                   "--object-store-memory", str(256 * 1024**2), "--disable-usage-stats",
                   "--dashboard-agent-grpc-port", str(free_port()),
                   "--dashboard-agent-listen-port", str(free_port()),
                   "--metrics-export-port", str(free_port()),
                   "--runtime-env-agent-port", str(free_port())]
            log_path = log_dir / f"ray-head-{attempt}.log"
            holder = ServerProcess("ray head", cmd, 0, log_path,
                                   lambda _, path=log_path: _address_of(path.read_text()))
            try:
                holder.wait_ready(timeout_s=420)
            except RuntimeError as err:
                holder.stop()
                print(f"ray head failed to start, trying again: {str(err)[-200:]}",
                      flush=True)
                continue
            self._holder = holder
            self.address = _address_of(log_path.read_text())
            return
        raise RuntimeError(f"no local Ray instance came up in {attempts} attempts")

    def reset_serve(self) -> None:
        """Shuts Serve down and kills kvroute's named actors in this instance."""
        subprocess.run([PYTHON, "-c", _RESET, self.address], cwd=ROOT, check=True,
                       env={**os.environ, **SLOW_BOX_ENV}, capture_output=True, timeout=300)

    def stop(self) -> None:
        self._holder.stop()

