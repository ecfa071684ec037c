"""The kvroute Serve application: gateway ingress -> engine replicas, one builder for all.

`build_app(args)` is the import path `router.serve.app:build_app` of a Serve config (the Helm
chart's RayService `serveConfigV2`) and what `kvroute serve` deploys. Args, all optional:

    model, replicas, tp, policy, block_size, engine, num_blocks, num_host_blocks,
    api_keys_file, approximate, max_model_len, gateways, cpus_per_rank, gpus_per_rank,
    sim_preset, max_num_seqs, max_num_batched_tokens, load_weight, imbalance_threshold,
    pending_ttl_s, host_cost_fraction
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import ray
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from router.core.config import RouterConfig
from router.gateway.app import Gateway, GatewayConfig
from router.serve.engine_replica import EngineReplica, ReplicaResources, engine_deployment_options
from worker.engine_config import EngineConfig

REQUEST_ROUTER_CLASS = "router.serve.request_router:KVRouteRequestRouter"


@dataclass(frozen=True)
class ServeArgs:
    model: str = "tiny"
    replicas: int = 2
    tp: int = 1
    policy: str = "cache_aware"
    block_size: int = 16
    engine: str = "real"  # real | sim
    num_blocks: int = 1024
    num_host_blocks: int = 0
    api_keys_file: str | None = None
    approximate: bool = False
    max_model_len: int | None = None
    gateways: int = 1
    cpus_per_rank: float = 1.0
    gpus_per_rank: float | None = None  # None: 1 when the engine is real and the cluster
    # has GPUs, else 0
    sim_preset: str = "h100-llama3-8b"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    load_weight: float | None = None  # RouterConfig's, when None
    imbalance_threshold: float | None = None  # RouterConfig's, when None
    pending_ttl_s: float | None = None  # RouterConfig's, when None
    host_cost_fraction: float | None = None  # RouterConfig's, when None

    def __post_init__(self):
        for name in ("replicas", "tp", "block_size", "num_blocks", "gateways",
                     "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.engine not in ("real", "sim"):
            raise ValueError(f"engine must be 'real' or 'sim', got {self.engine!r}")
        if not isinstance(self.num_host_blocks, int) or self.num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {self.num_host_blocks!r}")
        RouterConfig(**self.router_args())  # validates the policy and its knobs

    def router_args(self) -> dict[str, Any]:
        # Approximate mode assumes each replica caches as much as its pools hold.
        out: dict[str, Any] = {"policy": self.policy, "block_size": self.block_size,
                               "approximate": self.approximate,
                               "approx_capacity_blocks": self.num_blocks + self.num_host_blocks}
        for name in ("load_weight", "imbalance_threshold", "pending_ttl_s",
                     "host_cost_fraction"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, args: dict[str, Any]) -> ServeArgs:
        """From a Serve config's `args` (YAML/JSON values, `None` meaning the default)."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise ValueError(f"unknown kvroute args {unknown}; known: {sorted(known)}")
        return cls(**{k: v for k, v in args.items() if v is not None and v != ""})

    def engine_config(self) -> EngineConfig:
        return EngineConfig(model=self.model, executor=self.engine, tp=self.tp,
                            block_size=self.block_size, num_blocks=self.num_blocks,
                            num_host_blocks=self.num_host_blocks,
                            max_model_len=self.max_model_len, sim_preset=self.sim_preset,
                            max_num_seqs=self.max_num_seqs,
                            max_num_batched_tokens=self.max_num_batched_tokens,
                            tp_launcher="ray")  # ranks 1..tp-1: actors in the replica's PG


def _gpus_per_rank(args: ServeArgs) -> float:
    if args.gpus_per_rank is not None:
        return args.gpus_per_rank
    if args.engine != "real" or not ray.is_initialized():
        return 0.0
    return 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0


def build_app(args: dict[str, Any]) -> Application:
    serve_args = ServeArgs.from_dict(dict(args or {}))
    engine_config = serve_args.engine_config()
    router_config = RequestRouterConfig(
        request_router_class=REQUEST_ROUTER_CLASS,
        request_router_kwargs={
            "model": engine_config.served_model_name,
            "router": serve_args.router_args(),
        },
    )
    resources = ReplicaResources(cpus_per_rank=serve_args.cpus_per_rank,
                                 gpus_per_rank=_gpus_per_rank(serve_args))
    engine = EngineReplica.options(**engine_deployment_options(
        serve_args.replicas, serve_args.tp, resources, router_config)).bind(engine_config)
    gateway_config = GatewayConfig(
        model=serve_args.model, served_model_name=engine_config.served_model_name,
        block_size=serve_args.block_size,
        api_keys_file=serve_args.api_keys_file)
    return Gateway.options(
        num_replicas=serve_args.gateways, max_ongoing_requests=1024,
        ray_actor_options={"num_cpus": 0},
    ).bind(engine, gateway_config)
