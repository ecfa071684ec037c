"""The serve settings: one pydantic model, the single source of every serve setting; it
extends the engine's (worker/engine/config.py `EngineSettings`, also `kvroute engine`'s).

From `ServeSettings` derive: the `kvroute serve` flags, the `args` of
`router.apps.build:build_app` (`serve run router.apps.build:build_app replicas=2`, a Serve
config, the Helm chart's RayService), the `KVROUTE_<NAME>` environment variables (read by
the process that builds the application), and the chart's values schema for the settings it
sets (router/serve/chart_values.py). How they are loaded, and which wins: worker/settings.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from router.cluster.external_worker_spec import parse_workers
from router.core.config import RouterConfig
from router.core.hit_curve import HitCurveConfig
from router.core.policies import POLICY_NAMES
from worker.engine.config import EngineConfig, EngineSettings, PositiveInt
from worker.settings import FLAG_ONLY, env_name

_ROUTER_DEFAULTS = RouterConfig()
_BOUND_DEFAULTS = HitCurveConfig()


class ServeSettings(EngineSettings):
    """What `build_app` deploys: the model, the engine replicas (their settings are
    `kvroute engine`'s, worker/engine/config.py) and the router."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(
        "smollm2", description="'smollm2' (SmolLM2-135M-Instruct, a packaged GGUF), 'tiny' "
                               "(embedded random-weight Llama for tests, generated on first "
                               "use), a Hugging Face Llama-family checkpoint directory, a "
                               ".gguf file (converted once into the cache), or a Hugging Face "
                               "repo id org/name[@revision] (fetched into the hub cache, "
                               "$HF_HUB_CACHE, on first use); with workers, the model name "
                               "they serve")
    replicas: PositiveInt = Field(2, description="engine replicas (data parallel)")
    policy: Literal[POLICY_NAMES] = Field(  # type: ignore[valid-type]
        "cache_aware", description="routing policy: cache_aware weighs uncached prompt tokens "
                                   "against load; the others ignore or only hash the prefix")
    api_keys_file: str | None = Field(
        None, description="API keys file: JSON {key: tenant} or lines 'KEY TENANT'; also read "
                          f"from ${env_name('api_keys')} ('key=tenant,...'). Each tenant gets "
                          "its own cache namespace. Without keys the server is open")
    approximate: bool = Field(
        False, description="route on the router's own routing history instead of KV events")
    load_weight: float = Field(
        _ROUTER_DEFAULTS.load_weight, ge=0,
        description="cache_aware: prefill tokens one token of queued work costs (on CPU, "
                    "where prefill queues are long, 0.1 keeps groups on their replica)")
    imbalance_threshold: float = Field(
        _ROUTER_DEFAULTS.imbalance_threshold, gt=0,
        description="cache_aware: tokens of queued work by which the chosen replica may exceed "
                    "the least loaded before its cache gain must pay for the whole gap "
                    "(inf: no guard)")
    pending_ttl_s: float = Field(
        _ROUTER_DEFAULTS.pending_ttl_s, gt=0,
        description="a routed prompt's blocks count as cached on its replica until the "
                    "replica's events confirm them, while the request is outstanding and this "
                    "long after it finished")
    host_cost_fraction: float = Field(
        _ROUTER_DEFAULTS.host_cost_fraction, ge=0, le=1,
        description="cache_aware: cost of a host-cached prompt token as a fraction of "
                    "recomputing it (0: as good as a device hit, 1: no better than a miss)")
    continuation_affinity: bool = Field(
        _ROUTER_DEFAULTS.continuation_affinity,
        description="cache_aware: a conversation's next turn goes where its last turn went "
                    "(unless that replica's load is over 1.2x the mean or it holds over "
                    "1.2x the mean share of the recent sessions)")
    pooled_sample_rate: float = Field(
        _BOUND_DEFAULTS.sample_rate, gt=0, le=1,
        description="the online pooled bound (kvroute_pooled_hit_ratio): the least fraction "
                    "R of block hashes the routers and replicas (or the external gateways) "
                    "sample (a block is kept when its hash is below R_t x 2^64); a fleet of C "
                    "device KV blocks is sampled at the largest R x 2^k <= 8192 / C (k <= 6), "
                    "at least R")
    pooled_window_s: float = Field(
        _BOUND_DEFAULTS.recent_window_s, gt=0, allow_inf_nan=False,
        description="the online pooled bound's recent window (window=\"recent\"), seconds")
    gateways: PositiveInt = Field(
        2, description="gateway processes: the HTTP ingress (ingress gateway), the external "
                       "gateways, or with ingress direct the ingress request routers on each "
                       "node with a Serve proxy. Two by default, so every POST is served "
                       "while one restarts; they share their pending marks through the KV "
                       "index actor, so a prompt follows a prefix the other just routed")
    ingress: Literal["gateway", "direct"] = Field(
        "direct", description="direct (the default; with workers: gateway): HAProxy "
                              "(bundled with ray[serve]) asks kvroute's router for a replica "
                              "and sends the request to that engine replica's own HTTP server "
                              "(Serve's direct streaming: no Python proxy, no Ray hop per "
                              "token); gateway: requests enter through Serve's proxy and "
                              "kvroute's gateway deployment, which streams from the engine "
                              "replica over Ray")
    cpus_per_rank: float | None = Field(
        None, gt=0, description="CPUs reserved per TP rank (unset: 1, or with `kvroute serve` "
                                "on a local Ray instance a fair share of its CPUs when the "
                                "replicas would not fit)")
    gpus_per_rank: float | None = Field(
        None, ge=0, description="GPUs per TP rank (unset: 1 with engine real on a cluster "
                                "with GPUs, else 0)")
    workers: tuple[str, ...] = Field(
        (), description="external OpenAI-compatible workers (vLLM, SGLang, `kvroute engine`) "
                        "to route to instead of deploying engine replicas, each "
                        "URL[#kv_events=tcp://H:P[&kv_replay=tcp://H:P]] (its vLLM-format KV "
                        "event sockets; a flag or variable lists them comma-separated); model "
                        "is then the name they serve")
    tokenizer: str | None = Field(
        None, description="with workers: 'tiny' or a directory with the workers' "
                          "tokenizer.json, to tokenize and hash prompts for routing (unset: "
                          "model)")
    admin_key_file: str | None = Field(
        None, description="a file holding the admin key of POST/DELETE /v1/prefixes (pins) "
                          f"and, with workers, /v1/workers (${env_name('admin_key')} wins); "
                          "without either the admin API is off")
    worker_health_period_s: float = Field(
        2.0, gt=0, description="with workers: seconds between health checks of each worker")

    @field_validator("workers", mode="before")
    @classmethod
    def _split_workers(cls, value: Any) -> Any:
        # A flag or variable gives one comma-separated string; a Serve config, a list.
        return tuple(w for w in value.split(",") if w.strip()) if isinstance(value, str) else value

    @field_validator("workers")
    @classmethod
    def _parse_workers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(str(spec) for spec in parse_workers(value))  # canonical, no duplicates

    @model_validator(mode="before")
    @classmethod
    def _workers_take_the_gateway(cls, data: Any) -> Any:
        # With workers, the external gateway is the ingress: the default ingress is not theirs.
        if isinstance(data, dict) and data.get("workers") and "ingress" not in data:
            return {**data, "ingress": "gateway"}
        return data

    @model_validator(mode="after")
    def _check_components(self) -> ServeSettings:
        # The components' own checks too (e.g. max_model_len against the pool), so a bad
        # combination fails here, before Ray starts, not inside a replica.
        if self.workers and self.ingress == "direct":
            raise ValueError("ingress direct makes kvroute's engine replicas the ingress; "
                             "with workers the external gateway is the ingress (drop one)")
        RouterConfig(**self.router_args())
        self.engine_config()
        if self.workers and self.served_model_name is not None:
            raise ValueError("served_model_name names the engine replicas' model; with "
                             "workers, model is the name they serve")
        return self

    def router_args(self) -> dict[str, Any]:
        """RouterConfig's keyword arguments (sent to every request router as plain data)."""
        # Approximate mode assumes each replica caches as much as its pools hold.
        return {"policy": self.policy, "block_size": self.block_size,
                "approximate": self.approximate,
                "approx_capacity_blocks": self.num_blocks + self.num_host_blocks,
                "load_weight": self.load_weight,
                "imbalance_threshold": self.imbalance_threshold,
                "pending_ttl_s": self.pending_ttl_s,
                "host_cost_fraction": self.host_cost_fraction,
                "continuation_affinity": self.continuation_affinity}

    def bound_args(self) -> dict[str, Any]:
        """HitCurveConfig's keyword arguments (the hit-bound actor's, from the routers)."""
        return {"sample_rate": self.pooled_sample_rate, "recent_window_s": self.pooled_window_s}

    def engine_config(self, **more: Any) -> EngineConfig:
        # ranks 1..tp-1: actors in the replica's placement group
        return super().engine_config(**{"tp_launcher": "ray", **more})


class LaunchSettings(BaseModel):
    """Where `kvroute serve` runs the application: Ray and the HTTP listener."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", min_length=1, description="HTTP listen address")
    # Flags only: Kubernetes sets KVROUTE_PORT=tcp://... in every pod of a namespace with a
    # Service named kvroute.
    port: int = Field(8000, ge=1, le=65535, description="HTTP port",
                      json_schema_extra=FLAG_ONLY)
    address: str | None = Field(
        None, description="join this Ray cluster (e.g. 'auto' or 'ray://head:10001') instead "
                          "of starting a local Ray instance")
    num_cpus: PositiveInt | None = Field(
        None, description="CPUs of the local Ray instance (unset: this machine's)")
