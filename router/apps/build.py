"""The kvroute Serve application: gateway ingress -> engine replicas, one builder for all.

`build_app(args)` is the import path `router.apps.build:build_app` of a Serve config (the Helm
chart's RayService `serveConfigV2`, `serve run router.apps.build:build_app replicas=2`). Its
args are the fields of `ServeSettings` (router/serve/settings.py), over the `KVROUTE_<NAME>`
variables of the process that builds the app. `kvroute serve` deploys
`serve_application(settings)`. With `workers`, the app is the gateway in front of those
external servers instead (router/apps/external.py): no engine replica is deployed.
"""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from router.front.http_server import HttpConfig
from router.gateway.app import Gateway, GatewayConfig
from router.serve.engine_http import DirectEngineReplica, EngineHTTPConfig
from router.serve.engine_replica import EngineReplica, ReplicaResources, engine_deployment_options
from router.serve.ingress_endpoint import IngressRouteEndpoint, IngressRouteEndpointConfig
from router.serve.route_header import new_route_key
from router.serve.serve_env import key_paths, replica_env, with_env
from router.serve.settings import LaunchSettings, ServeSettings
from worker.engine.config import EngineConfig
from worker.settings import SettingsError, load_settings

REQUEST_ROUTER_CLASS = "router.serve.request_router:ServeRequestRouter"


def _gpus_per_rank(settings: ServeSettings) -> float:
    if settings.gpus_per_rank is not None:
        return settings.gpus_per_rank
    if settings.engine != "real" or not ray.is_initialized():
        return 0.0
    return 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0


def build_app(args: dict[str, Any]) -> Application:
    """Serve's application builder; raises SettingsError (a ValueError) on a bad arg."""
    settings = load_settings(ServeSettings, dict(args or {}), os.environ)
    if settings.workers:
        from router.apps.external import workers_application

        # Its gateways listen themselves, on LaunchSettings' host ($KVROUTE_HOST) and port
        # (never read from the environment: its default, the chart's gateway port). The
        # Serve proxy is not used: give the Serve config `proxy_location: Disabled`.
        launch = load_settings(LaunchSettings, {}, os.environ)
        return workers_application(settings, HttpConfig(launch.host, launch.port))
    return serve_application(settings)


def serve_application(serve_args: ServeSettings) -> Application:
    engine_config = serve_args.engine_config()
    router_config = RequestRouterConfig(
        request_router_class=REQUEST_ROUTER_CLASS,
        request_router_kwargs={
            "model": engine_config.served_model_name,
            "router": serve_args.router_args(),
            "bound": serve_args.bound_args(),
        },
    )
    resources = ReplicaResources(cpus_per_rank=(1.0 if serve_args.cpus_per_rank is None
                                                else serve_args.cpus_per_rank),
                                 gpus_per_rank=_gpus_per_rank(serve_args))
    options = engine_deployment_options(serve_args.replicas, serve_args.tp, resources,
                                        router_config)
    # Keys and limits reach every replica from here, not from its node's environment.
    env = replica_env(serve_args, os.environ)
    options["ray_actor_options"] = with_env(options["ray_actor_options"], env)
    if serve_args.ingress == "direct":
        return _direct_application(serve_args, engine_config, options, env)
    engine = EngineReplica.options(**options).bind(engine_config)
    gateway_config = GatewayConfig(
        model=serve_args.model, served_model_name=engine_config.served_model_name,
        block_size=serve_args.block_size, **key_paths(serve_args))
    return Gateway.options(
        num_replicas=serve_args.gateways, max_ongoing_requests=1024,
        ray_actor_options=with_env({"num_cpus": 0}, env),
    ).bind(engine, gateway_config)


def _direct_application(serve_args: ServeSettings, engine_config: EngineConfig,
                        engine_options: dict[str, Any], env: dict[str, str]) -> Application:
    """Ingress direct: the engine replicas are the ingress, each answering HTTP itself, and
    HAProxy asks the ingress request routers (`gateways` of them) which one serves a POST."""
    if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
        raise SettingsError(
            "ingress direct needs Ray Serve's HAProxy ingress: set the variables of "
            "router/serve/serve_env.py (RAY_SERVE_ENABLE_HA_PROXY=1, ...) in the environment "
            "of every Ray process; `kvroute serve` and the Helm chart set them")
    route_key = new_route_key()  # signs route headers: made per app, never in the env
    pool_tokens = engine_config.num_blocks * engine_config.block_size  # caps the context
    engine = DirectEngineReplica.options(**engine_options).bind(
        engine_config, EngineHTTPConfig(model=serve_args.model,
                                        block_size=serve_args.block_size,
                                        **key_paths(serve_args), route_key=route_key))
    router = IngressRouteEndpoint.options(
        num_replicas=serve_args.gateways,
        ray_actor_options=with_env(IngressRouteEndpoint.ray_actor_options, env)).bind(
        engine, IngressRouteEndpointConfig(model=serve_args.model,
                                    served_model_name=engine_config.served_model_name,
                                    block_size=serve_args.block_size,
                                    max_model_len=min(engine_config.max_model_len
                                                      or pool_tokens, pool_tokens),
                                    api_keys_file=key_paths(serve_args)["api_keys_file"],
                                    route_key=route_key))
    return engine._with_ingress_request_router(router)  # Serve LLM's direct streaming hook
