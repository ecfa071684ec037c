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

from benchmarks.simlib.servers import PYTHON, ROOT, SLOW_BOX_ENV, ServerProcess

# A local Ray instance started by `ray.init` in a holder process (never `ray start`: that
# records its address in /tmp/ray/ray_current_cluster, and then every `ray.init()` on this
# host, other people's tests included, joins it), with the node's registration awaited for
# up to 5 minutes instead of 30 s (on a crowded box the raylet registers late, not never)
# and the dashboard agent in its minimal mode (what Ray runs without ray[default]'s extras:
# it starts in a fraction of the time, and the raylet gives up on an agent that has not
# reported its ports within ~15 s).
_HOLDER = """
import signal, sys, threading, time
import ray
import ray._private.services as services
import ray._private.utils

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
ray._private.utils.get_dashboard_dependency_error = lambda: "minimal agent, for a crowded box"
ray.init(num_cpus=int(sys.argv[1]), include_dashboard=False, namespace="serve",
         object_store_memory=256 * 1024**2)
print("RAY_ADDRESS", ray.get_runtime_context().gcs_address, flush=True)
stop = threading.Event()
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: stop.set())
stop.wait()
ray.shutdown()
"""

_RESET = """
import sys, ray
from ray import serve
ray.init(address=sys.argv[1], namespace="serve", log_to_driver=False)
serve.shutdown()
for name in ("kvroute-index", "kvroute-metrics", "kvroute-workers"):
    try:
        ray.kill(ray.get_actor(name, namespace="kvroute"), no_restart=True)
    except ValueError:
        pass
"""


def _address_of(log_text: str) -> str | None:
    """The GCS address the holder prints once the instance is up."""
    m = re.search(r"^RAY_ADDRESS (\S+)$", log_text, re.MULTILINE)
    return m.group(1) if m else None


class RayHead:
    """A local Ray instance with `num_cpus` CPUs, up until `stop()`."""

    def __init__(self, log_dir, num_cpus: int = 2, attempts: int = 8):
        for attempt in range(attempts):
            cmd = [PYTHON, "-c", _HOLDER, str(num_cpus)]
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
            self.pid = holder.proc.pid  # its Ray processes run in this session
            self.address = _address_of(log_path.read_text())
            return
        raise RuntimeError(f"no local Ray instance came up in {attempts} attempts")

    def reset_serve(self) -> None:
        """Shuts Serve down and kills kvroute's named actors in this instance."""
        subprocess.run([PYTHON, "-c", _RESET, self.address], cwd=ROOT, check=True,
                       env={**os.environ, **SLOW_BOX_ENV}, capture_output=True, timeout=300)

    def stop(self) -> None:
        self._holder.stop()

