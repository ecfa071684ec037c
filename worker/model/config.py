"""The Llama-family model description, parsed and validated from a HF config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
# Qwen2 and Qwen3 configs may carry a sliding window that only some layers use.
_QWEN_WINDOWED = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
_SUPPORTED_ROPE_TYPES = ("default", "llama3")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Llama3RopeScaling:
    """`rope_type: llama3` frequency scaling (Llama 3.1+)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Llama3RopeScaling | None
    max_position_embeddings: int
    # Longest sequence served exactly: a sliding window (Mistral, Qwen2/3) is not implemented,
    # so sequences are capped at the window, within which full attention is identical.
    max_model_len_tokens: int
    qkv_bias: bool
    o_proj_bias: bool
    mlp_bias: bool
    # Qwen3: an RMSNorm over head_dim (one weight shared by every head) on each query and
    # key head, after the projection and before RoPE.
    qk_norm: bool
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    checkpoint_dtype: torch.dtype

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_model_len_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"config: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"config: num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )

    def check_tp(self, tp: int) -> None:
        """Raise ValueError unless every sharded dimension divides evenly by tp."""
        if tp < 1:
            raise ValueError(f"tensor parallel size must be >= 1, got {tp}")
        for what, n in (
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("intermediate_size", self.intermediate_size),
        ):
            if n % tp:
                raise ValueError(f"tensor parallel size {tp} does not divide {what} ({n})")

    @classmethod
    def from_hf(cls, hf: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
        """Parse a HF config.json dict (both the old `rope_theta`/`rope_scaling` fields and
        the transformers 5 `rope_parameters`), plus generation_config.json when present."""
        archs = hf.get("architectures") or []
        arch = archs[0] if archs else _ARCH_BY_MODEL_TYPE.get(hf.get("model_type", ""), "")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch or hf.get('model_type')!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU)")
        num_heads = _required(hf, "num_attention_heads")
        hidden = _required(hf, "hidden_size")
        max_pos = _required(hf, "max_position_embeddings")
        rope_theta, rope_scaling = _parse_rope(hf)
        is_qwen2 = arch == "Qwen2ForCausalLM"
        attention_bias = bool(hf.get("attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=_required(hf, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_required(hf, "intermediate_size"),
            num_layers=_required(hf, "num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hidden // num_heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=max_pos,
            max_model_len_tokens=min(max_pos, _sliding_window(hf, arch) or max_pos),
            qkv_bias=is_qwen2 or attention_bias,
            o_proj_bias=(not is_qwen2) and attention_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=_eos_ids(hf, generation or {}),
            checkpoint_dtype=_DTYPES.get(
                str(hf.get("dtype") or hf.get("torch_dtype")), torch.float32
            ),
        )


_ARCH_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def parse_dtype(name: str) -> torch.dtype:
    """'float32' | 'float16' | 'bfloat16' -> torch dtype."""
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; choose one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def _required(hf: dict[str, Any], key: str) -> int:
    if key not in hf:
        raise ValueError(f"config.json lacks required field {key!r}")
    return int(hf[key])


def _parse_rope(hf: dict[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rope_theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope type {rope_type!r}; supported: {', '.join(_SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return rope_theta, None
    original = params.get("original_max_position_embeddings", hf["max_position_embeddings"])
    return rope_theta, Llama3RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(original),
    )


def _sliding_window(hf: dict[str, Any], arch: str) -> int | None:
    window = hf.get("sliding_window")
    if window is None:
        return None
    if arch in _QWEN_WINDOWED:
        # Qwen2/3 slide only when use_sliding_window is set, and only on the layers from
        # max_window_layers on (transformers 5 spells them out in layer_types).
        if "layer_types" in hf:
            slides = "sliding_attention" in (hf["layer_types"] or [])
        else:
            slides = bool(hf.get("use_sliding_window", False)) and int(
                hf.get("max_window_layers", 0)
            ) < int(hf["num_hidden_layers"])
        if not slides:
            return None
    return int(window)


def _eos_ids(hf: dict[str, Any], generation: dict[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (hf.get("eos_token_id"), generation.get("eos_token_id")):
        for value in source if isinstance(source, list) else [source]:
            if value is not None and int(value) not in ids:
                ids.append(int(value))
    return tuple(ids)
