"""Rotary position embedding (the HF "rotate half" layout), default and llama3 scaling.

cos/sin are computed per forward from the positions (fp32, as transformers does) instead
of a table over max_position_embeddings: a [T, head_dim] product is cheap, and a table for
a 128k-context model would hold hundreds of MB.
"""

from __future__ import annotations

import math

import torch

from worker.model.config import Llama3RopeScaling


def rope_inv_freq(head_dim: int, theta: float, scaling: Llama3RopeScaling | None) -> torch.Tensor:
    """[head_dim / 2] fp32 inverse frequencies."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and the band
    # between low_freq_wavelen and high_freq_wavelen interpolated smoothly.
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] -> cos, signed_sin [T, 1, head_dim] in dtype, broadcastable over heads.

    signed_sin is sin with its first half negated: apply_rope then only swaps x's halves
    (HF's rotate_half negates them too, -x2 * sin == x2 * -sin exactly), one op fewer per
    rotation, and computed once per step instead of once per layer.
    """
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin()
    half = sin.shape[-1] // 2
    signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return emb.cos().to(dtype)[:, None, :], signed_sin.to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated by the angles of its token's position (HF's
    x * cos + rotate_half(x) * sin, bit for bit): the halves of x swapped times signed_sin."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin
