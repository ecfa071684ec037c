"""Kernel benchmark: the paged-KV kernels at a real model's sizes, against the device's own
copy bandwidth, measured in the same run.

    python benchmarks/bench_kernels.py              # a CUDA GPU: Triton kernels, Llama 3 8B layer
    python benchmarks/bench_kernels.py --quick      # small sizes, for a smoke run (CPU: reference)

Defaults are one Llama 3 8B layer (32 query heads, 8 KV heads, head dim 128, bf16 on CUDA),
a batch of 64 requests of 4,096 tokens each, KV blocks of 16 tokens scattered over the pool
in random order, as a prefix cache leaves them. Figures (medians of `--repeats` timed calls,
CUDA events on a GPU):

- copy_gb_s: device-to-device copy of a `--copy-mib` buffer, bytes read + written / time.
- decode_gb_s: decode attention (one query per request over its whole context): the K and
  V bytes it must read, batch x context x KV heads x head dim x 2 x element size, / time.
- decode_over_copy: decode_gb_s / copy_gb_s (target: >= 0.6 on a GPU).
- prefill_tflop_s: prefill attention of `--prefill-tokens` new tokens per request over the
  rest of the context already cached, QK^T and PV multiply-adds x 2 / time.
- write_kv_gb_s: storing one decode step's K and V (batch x KV heads x head dim x 2) into
  their slots, bytes written / time (tiny; launch-bound by design).
- max_abs_err_*: each kernel's output against the torch reference on the same inputs, for
  the first requests (`--check` of them; the reference gathers, so checking all is slow).

`--impl` picks the kernels: `triton` (the default on CUDA) or `reference` (the torch code
the engine runs on CPU). `--impl triton` on CPU runs Triton's interpreter
(TRITON_INTERPRET=1, set here before the kernels are defined): a correctness smoke test at
small sizes, not a speed figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels import reference  # noqa: E402
from kv.hashing import DEFAULT_BLOCK_SIZE  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--impl", default="auto", choices=("auto", "triton", "reference"))
    p.add_argument("--dtype", default="auto", choices=("auto", *DTYPES))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=4096, help="tokens per request")
    p.add_argument("--prefill-tokens", type=int, default=512,
                   help="new tokens per request in the prefill figure")
    p.add_argument("--prefill-batch", type=int, default=8)
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    p.add_argument("--copy-mib", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--check", type=int, default=2, help="requests checked against the reference")
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.context, args.prefill_tokens, args.prefill_batch = 4, 256, 64, 2
        args.num_heads, args.num_kv_heads, args.head_dim = 4, 2, 32
        args.copy_mib, args.repeats = 16, 3
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU is available")
    if args.impl == "auto":
        args.impl = "triton" if args.device == "cuda" else "reference"
    if args.dtype == "auto":
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    for name in ("batch", "context", "prefill_tokens", "prefill_batch", "num_heads",
                 "num_kv_heads", "head_dim", "block_size", "copy_mib", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.num_heads % args.num_kv_heads:
        p.error("--num-heads must be a multiple of --num-kv-heads")
    if args.prefill_tokens > args.context:
        p.error("--prefill-tokens cannot exceed --context")
    return args


def median_seconds(fn: Callable[[], object], device: str, repeats: int) -> float:
    """Median wall time of one call, after 3 untimed calls (compilation, caches)."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def copy_gb_s(mib: int, device: str, repeats: int) -> float:
    """Device-to-device copy of a `mib` MiB buffer: bytes read + written / time."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    return 2 * src.numel() / median_seconds(lambda: dst.copy_(src), device, repeats) / 1e9


def paged_pool(num_seqs: int, num_tokens: int, args, dtype, gen) -> tuple:
    """K/V caches holding num_seqs sequences of num_tokens, their blocks in random order."""
    blocks_per_seq = -(-num_tokens // args.block_size)
    num_blocks = num_seqs * blocks_per_seq + 1
    perm = torch.randperm(num_blocks, generator=gen)
    tables = perm[: num_seqs * blocks_per_seq].view(num_seqs, blocks_per_seq).to(torch.int32)
    shape = (num_blocks, args.block_size, args.num_kv_heads, args.head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype).to(args.device)
    v_cache = torch.randn(shape, generator=gen).to(dtype).to(args.device)
    return k_cache, v_cache, tables.to(args.device)


def run(args: argparse.Namespace) -> dict:
    if args.impl == "triton" and args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
    if args.impl == "triton":
        from kernels.triton_decode_attention import decode_attention
        from kernels.triton_kv_write import write_kv
        from kernels.triton_prefill_attention import prefill_attention
    else:
        decode_attention, write_kv = reference.decode_attention, reference.write_kv
        prefill_attention = reference.prefill_attention
    dtype, dev = DTYPES[args.dtype], args.device
    gen = torch.Generator().manual_seed(0)
    elem = torch.tensor([], dtype=dtype).element_size()
    scale = 1 / math.sqrt(args.head_dim)
    out: dict = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                 "impl": args.impl, "dtype": args.dtype, "quick": args.quick,
                 "batch": args.batch, "context": args.context,
                 "heads": [args.num_heads, args.num_kv_heads, args.head_dim],
                 "block_size": args.block_size}

    out["copy_gb_s"] = copy_gb_s(args.copy_mib, dev, args.repeats)

    # Decode attention over batch x context tokens.
    k_cache, v_cache, tables = paged_pool(args.batch, args.context, args, dtype, gen)
    seq_lens = torch.full((args.batch,), args.context, dtype=torch.int32, device=dev)
    q = torch.randn(args.batch, args.num_heads, args.head_dim, generator=gen).to(dtype).to(dev)
    t = median_seconds(lambda: decode_attention(q, k_cache, v_cache, tables, seq_lens, scale),
                       dev, args.repeats)
    kv_bytes = args.batch * args.context * args.num_kv_heads * args.head_dim * 2 * elem
    out["decode_ms"] = t * 1e3
    out["decode_gb_s"] = kv_bytes / t / 1e9
    out["decode_over_copy"] = out["decode_gb_s"] / out["copy_gb_s"]
    n = min(args.check, args.batch)
    got = decode_attention(q[:n], k_cache, v_cache, tables[:n], seq_lens[:n], scale)
    want = reference.decode_attention(q[:n], k_cache, v_cache, tables[:n], seq_lens[:n], scale)
    out["max_abs_err_decode"] = (got.float() - want.float()).abs().max().item()

    # One decode step's K/V written into its slots.
    key = torch.randn(args.batch, args.num_kv_heads, args.head_dim, generator=gen)
    key, value = key.to(dtype).to(dev), key.clone().to(dtype).to(dev)
    slots = (tables[:, -1].long() * args.block_size).contiguous()
    t = median_seconds(lambda: write_kv(key, value, k_cache, v_cache, slots), dev, args.repeats)
    out["write_kv_gb_s"] = 2 * key.numel() * elem / t / 1e9
    k_cache = v_cache = tables = None  # free the decode pool before the prefill one

    # Prefill: prefill_tokens new tokens a request over (context - prefill_tokens) cached.
    pb, new, ctx = args.prefill_batch, args.prefill_tokens, args.context
    k_cache, v_cache, tables = paged_pool(pb, ctx, args, dtype, gen)
    seq_lens = torch.full((pb,), ctx, dtype=torch.int32, device=dev)
    cu = torch.arange(0, (pb + 1) * new, new, dtype=torch.int32, device=dev)
    qp = torch.randn(pb * new, args.num_heads, args.head_dim, generator=gen).to(dtype).to(dev)
    t = median_seconds(lambda: prefill_attention(qp, k_cache, v_cache, tables, cu, seq_lens,
                                                 scale, new), dev, args.repeats)
    keys_seen = pb * sum(ctx - new + i + 1 for i in range(new))  # causal over the new tokens
    flops = 4 * keys_seen * args.num_heads * args.head_dim  # QK^T and PV, a multiply-add = 2
    out["prefill_ms"] = t * 1e3
    out["prefill_tflop_s"] = flops / t / 1e12
    n = min(args.check, pb)
    got = prefill_attention(qp[: n * new], k_cache, v_cache, tables[:n], cu[: n + 1],
                            seq_lens[:n], scale, new)
    want = reference.prefill_attention(qp[: n * new], k_cache, v_cache, tables[:n], cu[: n + 1],
                                       seq_lens[:n], scale, new)
    out["max_abs_err_prefill"] = (got.float() - want.float()).abs().max().item()
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = run(args)
    rows = [("device-to-device copy (GB/s)", out["copy_gb_s"]),
            (f"decode attention, {args.batch} x {args.context} tokens (GB/s)", out["decode_gb_s"]),
            ("decode attention / copy bandwidth", out["decode_over_copy"]),
            (f"prefill attention, {args.prefill_batch} x {args.prefill_tokens} new (TFLOP/s)",
             out["prefill_tflop_s"]),
            ("write_kv, one decode step (GB/s)", out["write_kv_gb_s"]),
            ("max |kernel - reference|, decode", out["max_abs_err_decode"]),
            ("max |kernel - reference|, prefill", out["max_abs_err_prefill"])]
    print(f"{out['device']}, {out['impl']} kernels, {out['dtype']}")
    for name, value in rows:
        print(f"{name:<56} {value:>12.4g}")
    out = {k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in out.items()}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
