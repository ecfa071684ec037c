"""The engine replica's configuration: the settings a user gives (`EngineSettings`: flags,
`KVROUTE_<NAME>` variables, Serve args; `kvroute serve` extends them) and the config an
engine is built from (`EngineConfig`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kv.hashing import DEFAULT_BLOCK_SIZE
from worker.executor.sim import PRESETS
from worker.model.gguf.builtin import SMOLLM2_NAME, is_gguf_path
from worker.model.hf_hub import is_repo_id, repo_name


def default_served_name(model: str) -> str:
    """The API's model name when none is given: `tiny`, `smollm2`, a repo id as vLLM serves
    it (`org/name`, without a revision), a GGUF file's name without .gguf, or a checkpoint
    directory's name."""
    if model in ("tiny", SMOLLM2_NAME):
        return model
    if is_gguf_path(model):  # the file's name without .gguf
        return os.path.basename(model)[: -len(".gguf")]
    if is_repo_id(model):
        return repo_name(model)
    return os.path.basename(os.path.normpath(model))


@dataclass(frozen=True)
class EngineConfig:
    model: str = "tiny"  # "tiny", "smollm2", a HF checkpoint directory or repo id, a .gguf
    served_model_name: str = ""  # the API's model name and hash namespace; default derived
    replica_id: str = "replica-0"
    engine: str = "real"  # real: run the model; sim: the simulated executor
    sim_preset: str = "h100-llama3-8b"
    tp: int = 1
    tp_launcher: str = "local"  # ranks 1..tp-1: local processes | ray actors (Serve)
    block_size: int = DEFAULT_BLOCK_SIZE
    num_blocks: int = 1024
    num_host_blocks: int = 0
    pin_budget_blocks: int | None = None  # default: a quarter of num_blocks
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    dtype: str = "float32"
    device: str = "auto"  # auto | cpu | cuda

    def __post_init__(self):
        if not self.served_model_name:
            object.__setattr__(self, "served_model_name", default_served_name(self.model))
        if self.pin_budget_blocks is None:
            object.__setattr__(self, "pin_budget_blocks", self.num_blocks // 4)
        if self.engine not in ("real", "sim"):
            raise ValueError(f"engine must be 'real' or 'sim', got {self.engine!r}")
        if self.tp_launcher not in ("local", "ray"):
            raise ValueError(f"tp_launcher must be 'local' or 'ray', got {self.tp_launcher!r}")
        for name in ("tp", "block_size", "num_blocks", "max_num_seqs",
                     "max_num_batched_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got "
                                 f"{getattr(self, name)!r}")
        if self.num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {self.num_host_blocks}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")


PositiveInt = Annotated[int, Field(ge=1)]


class EngineSettings(BaseModel):
    """The model and one engine replica's pools and batch limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(
        "tiny", description="'tiny' (embedded random-weight Llama for tests, generated on "
                            "first use), 'smollm2' (SmolLM2-135M-Instruct, a packaged GGUF), "
                            "a Hugging Face Llama-family checkpoint directory, a .gguf file "
                            "(converted once into the cache), or a Hugging Face repo id "
                            "org/name[@revision] (fetched into the hub cache, $HF_HUB_CACHE, "
                            "on first use)")
    served_model_name: str | None = Field(
        None, min_length=1, description="the model name the API serves, clients send and "
                                        "prefixes are hashed under (unset: 'tiny', 'smollm2', "
                                        "the repo id, or the checkpoint directory's name)")
    engine: Literal["real", "sim"] = Field(
        "real", description="real: run the model; sim: simulated executor (modelled step "
                            "times, no model compute) for routing experiments")
    sim_preset: Literal[tuple(PRESETS)] = Field(  # type: ignore[valid-type]
        "h100-llama3-8b", description="timing preset of the simulated executor")
    tp: PositiveInt = Field(1, description="tensor-parallel ranks per replica")
    block_size: PositiveInt = Field(
        DEFAULT_BLOCK_SIZE, description="tokens per KV block (and per prefix hash)")
    num_blocks: PositiveInt = Field(
        1024, description="KV blocks per replica (device pool); caps the context length too")
    num_host_blocks: int = Field(
        0, ge=0, description="host-memory KV blocks per replica (0: no host tier)")
    max_model_len: int | None = Field(
        None, ge=2, description="context length limit in tokens (unset: the model's, capped by "
                                "the pool)")
    max_num_seqs: PositiveInt = Field(64, description="requests a replica runs at once")
    max_num_batched_tokens: PositiveInt = Field(
        2048, description="tokens a replica computes in one step")

    def engine_config(self, **more: Any) -> EngineConfig:
        """The engine's config; `more` sets what is not a user's setting (replica_id, ...).
        Raises ValueError naming a bad combination (e.g. max_model_len against the pool)."""
        names = EngineSettings.model_fields.keys() - {"served_model_name"}
        return EngineConfig(served_model_name=self.served_model_name or "",
                            **{name: getattr(self, name) for name in names}, **more)
