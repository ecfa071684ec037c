"""Scalar K-quant decoders written from llama.cpp's block layouts (ggml-quants.c,
dequantize_row_q{4,5,6}_K), one value at a time: the reference that the vectorised
dequantization is checked against. A super-block holds 256 values."""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(raw: bytes) -> float:
    return float(np.frombuffer(raw, dtype=np.float16)[0])


def _scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
    """The 6-bit scale and min of sub-block j, packed in 12 bytes."""
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def q4_k(block: bytes) -> list[float]:
    d, dmin, scales, qs = _f16(block[0:2]), _f16(block[2:4]), block[4:16], block[16:144]
    out = [0.0] * QK_K
    for chunk in range(4):  # 64 values: low nibbles, then high nibbles of 32 bytes
        sc1, m1 = _scale_min_k4(2 * chunk, scales)
        sc2, m2 = _scale_min_k4(2 * chunk + 1, scales)
        for lane in range(32):
            byte = qs[32 * chunk + lane]
            out[64 * chunk + lane] = d * sc1 * (byte & 0xF) - dmin * m1
            out[64 * chunk + 32 + lane] = d * sc2 * (byte >> 4) - dmin * m2
    return out


def q5_k(block: bytes) -> list[float]:
    d, dmin, scales = _f16(block[0:2]), _f16(block[2:4]), block[4:16]
    qh, qs = block[16:48], block[48:176]
    out = [0.0] * QK_K
    for chunk in range(4):  # the 5th bits of chunk c sit at bits 2c and 2c+1 of qh
        sc1, m1 = _scale_min_k4(2 * chunk, scales)
        sc2, m2 = _scale_min_k4(2 * chunk + 1, scales)
        for lane in range(32):
            byte, high = qs[32 * chunk + lane], qh[lane]
            low_q = (byte & 0xF) + (16 if high >> (2 * chunk) & 1 else 0)
            high_q = (byte >> 4) + (16 if high >> (2 * chunk + 1) & 1 else 0)
            out[64 * chunk + lane] = d * sc1 * low_q - dmin * m1
            out[64 * chunk + 32 + lane] = d * sc2 * high_q - dmin * m2
    return out


def q6_k(block: bytes) -> list[float]:
    ql, qh = block[0:128], block[128:192]
    scales = np.frombuffer(block[192:208], dtype=np.int8).tolist()
    d = _f16(block[208:210])
    out = [0.0] * QK_K
    for half in range(2):  # 128 values each: 64 bytes of low nibbles, 32 of 2-bit highs
        lo, hi, sc, base = ql[64 * half:], qh[32 * half:], scales[8 * half:], 128 * half
        for lane in range(32):
            s = lane // 16
            q1 = ((lo[lane] & 0xF) | ((hi[lane] >> 0 & 3) << 4)) - 32
            q2 = ((lo[lane + 32] & 0xF) | ((hi[lane] >> 2 & 3) << 4)) - 32
            q3 = ((lo[lane] >> 4) | ((hi[lane] >> 4 & 3) << 4)) - 32
            q4 = ((lo[lane + 32] >> 4) | ((hi[lane] >> 6 & 3) << 4)) - 32
            out[base + lane] = d * sc[s] * q1
            out[base + lane + 32] = d * sc[s + 2] * q2
            out[base + lane + 64] = d * sc[s + 4] * q3
            out[base + lane + 96] = d * sc[s + 6] * q4
    return out
