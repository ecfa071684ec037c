"""The simulated executor: a roofline cost model in place of the forward pass.

Everything else stays real (scheduler, KV manager, events, router). `step_time_s(step)` is
what a step would take on the modelled hardware; `execute()` spends that time (live mode,
behind the real gateway) or only reports it (a discrete-event simulation advances its own
clock). Sampled tokens are a deterministic function of (request id, position), and so are
their log-probabilities when asked for (a made-up but consistent distribution: the sampled
token is the most likely, with probability 1/2, and the i-th alternative after it, the next
token ids in turn, has 2^-(i+1); see `sim_logprobs`).

Cost of a step (P = parameters, L = layers, d = hidden size, KV = KV bytes per token):
    overhead
  + max(weights read: 2P bytes / (HBM bandwidth x MBU),
        linear layers:  2P FLOPs x tokens / (peak FLOPs x MFU))
  + prefill attention:  4 L d FLOPs x sum over new tokens of their context / (peak x MFU)
  + decode KV read:     KV bytes x sum over decoding requests of context / (HBM x MBU)
  + host tier copies:   KV bytes x block size x blocks copied / host link bandwidth
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from kv.hashing import DEFAULT_BLOCK_SIZE
from protocol.engine import SampledToken, SampleFailure, SamplingParams, TokenLogprobs
from worker.engine.step import StepInput


@dataclass(frozen=True)
class SimPreset:
    name: str
    num_params: float
    num_layers: int
    hidden_size: int
    kv_bytes_per_token: int
    peak_flops: float  # dense FLOP/s at the serving dtype
    hbm_bytes_per_s: float
    mfu: float  # achieved fraction of peak FLOPs in prefill-heavy steps
    mbu: float  # achieved fraction of HBM bandwidth in decode-heavy steps
    overhead_s: float  # per step: scheduling, launches, sampling
    source: str
    host_copy_bytes_per_s: float = 50e9  # device <-> host KV copies (PCIe Gen5 x16)

    def __post_init__(self):
        if not (0 < self.mfu <= 1 and 0 < self.mbu <= 1):
            raise ValueError(f"{self.name}: mfu and mbu must be in (0, 1]")
        if not self.host_copy_bytes_per_s > 0:
            raise ValueError(f"{self.name}: host_copy_bytes_per_s must be > 0")


PRESETS: dict[str, SimPreset] = {
    # Llama 3 8B: 8.03e9 params, 32 layers, d=4096, 8 KV heads x 128 -> 2*32*8*128*2 bytes
    # = 128 KiB of bf16 KV per token. H100 SXM: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3
    # (NVIDIA H100 datasheet). MFU 0.5 and MBU 0.7 are typical of vLLM/SGLang on H100:
    # they give ~31k prefill tokens/s and a ~7 ms decode step at small batch, in line with
    # published Llama 3 8B H100 serving benchmarks (vLLM v0.6 perf blog, Sept 2024).
    # Host tier copies cross PCIe Gen5 x16 (64 GB/s a direction, ~50 GB/s achieved): a
    # 16-token block of 2 MiB takes ~42 us.
    "h100-llama3-8b": SimPreset(
        name="h100-llama3-8b", num_params=8.03e9, num_layers=32, hidden_size=4096,
        kv_bytes_per_token=131072, peak_flops=989e12, hbm_bytes_per_s=3.35e12,
        mfu=0.5, mbu=0.7, overhead_s=1e-3,
        source="NVIDIA H100 SXM datasheet; Llama 3 8B config; vLLM v0.6 perf blog; "
               "PCIe Gen5 x16 for host copies"),
    # The same model on an NVIDIA L4 (24 GB): 121 TFLOP/s dense bf16 (242 with sparsity),
    # 300 GB/s GDDR6 (NVIDIA L4 datasheet), same MFU/MBU: ~3.8k prefill tokens/s and a
    # ~76 ms decode step. On a CPU box shared by several engines, its steps stay long next
    # to the engines' own CPU time, so routing effects are not lost in CPU contention.
    "l4-llama3-8b": SimPreset(
        name="l4-llama3-8b", num_params=8.03e9, num_layers=32, hidden_size=4096,
        kv_bytes_per_token=131072, peak_flops=121e12, hbm_bytes_per_s=300e9,
        mfu=0.5, mbu=0.7, overhead_s=1e-3,
        source="NVIDIA L4 datasheet; Llama 3 8B config; MFU/MBU as h100-llama3-8b",
        host_copy_bytes_per_s=25e9),  # PCIe Gen4 x16 (32 GB/s a direction)
    # A small, fast preset for tests and live demos on a CPU box.
    "tiny": SimPreset(
        name="tiny", num_params=2e8, num_layers=8, hidden_size=1024,
        kv_bytes_per_token=32768, peak_flops=1e14, hbm_bytes_per_s=1e12,
        mfu=0.5, mbu=0.7, overhead_s=2e-4, source="made up: fast and cheap"),
}


def get_preset(name: str) -> SimPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown sim preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


def step_time_s(preset: SimPreset, step: StepInput, block_size: int = DEFAULT_BLOCK_SIZE) -> float:
    """Modelled duration of one step (see the module docstring); `block_size` (tokens per
    KV block) sizes the step's host tier copies."""
    flops_per_s = preset.peak_flops * preset.mfu
    bytes_per_s = preset.hbm_bytes_per_s * preset.mbu
    num_tokens = 0
    prefill_token_context = 0  # sum over new prefill tokens of the context each attends to
    decode_context = 0
    for seq in step.seqs:
        n = len(seq.token_ids)
        num_tokens += n
        if n == 1 and seq.sample and seq.start_pos > 0:
            decode_context += seq.start_pos + 1
        else:
            prefill_token_context += n * seq.start_pos + n * (n + 1) // 2
    if num_tokens == 0:
        return 0.0
    linear = max(2 * preset.num_params / bytes_per_s,
                 2 * preset.num_params * num_tokens / flops_per_s)
    attention = 4 * preset.num_layers * preset.hidden_size * prefill_token_context / flops_per_s
    kv_read = preset.kv_bytes_per_token * decode_context / bytes_per_s
    copies = len(step.copies.swap_in) + len(step.copies.swap_out)
    copy = (copies * preset.kv_bytes_per_token * block_size / preset.host_copy_bytes_per_s
            if copies else 0.0)
    return preset.overhead_s + linear + attention + kv_read + copy


def sim_logprobs(token_id: int, k: int, first_token_id: int, vocab_size: int
                 ) -> TokenLogprobs:
    """The simulator's log-probabilities of `token_id` and its `k` most likely tokens: the
    sampled token first, with probability 1/2, then the token ids after it (wrapping inside
    [first_token_id, vocab_size)) with 1/4, 1/8, ... (they sum to less than 1)."""
    span = vocab_size - first_token_id
    top = tuple((first_token_id + (token_id - first_token_id + i) % span,
                 -(i + 1) * math.log(2)) for i in range(min(k, span)))
    return TokenLogprobs(token_id, -math.log(2), top)


class SimExecutor:
    """Executor with modelled step times (see worker/executor/executor.py for the contract)."""

    def __init__(self, preset: str | SimPreset = "h100-llama3-8b", *, vocab_size: int = 32000,
                 eos_token_ids: tuple[int, ...] = (), realtime: bool = True,
                 first_token_id: int = 0, block_size: int = DEFAULT_BLOCK_SIZE):
        self.preset = get_preset(preset) if isinstance(preset, str) else preset
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.realtime = realtime
        self.first_token_id = first_token_id  # lowest id it samples (skip special tokens)
        self.block_size = block_size  # the engine's, for the cost of host tier copies
        self.last_step_time_s = 0.0
        self.total_step_time_s = 0.0

    def execute(self, step: StepInput, sampling: Mapping[str, SamplingParams]
                ) -> dict[str, SampledToken | SampleFailure]:
        self.last_step_time_s = step_time_s(self.preset, step, self.block_size)
        self.total_step_time_s += self.last_step_time_s
        if self.realtime:
            time.sleep(self.last_step_time_s)  # the modelled compute, not synchronisation
        out: dict[str, SampledToken | SampleFailure] = {}
        for s in step.seqs:
            if not s.sample:
                continue
            sp = sampling.get(s.request_id)
            banned = () if sp is None or s.num_output_tokens >= sp.min_tokens else (
                sp.stop_token_ids)
            token = self._token(s.request_id, s.start_pos + len(s.token_ids), banned)
            if token is None:
                out[s.request_id] = SampleFailure("sampling failed: every token is masked")
                continue
            logprobs = None
            if sp is not None and sp.logprobs is not None:
                logprobs = sim_logprobs(token, sp.logprobs, self.first_token_id,
                                        self.vocab_size)
            out[s.request_id] = SampledToken(token, logprobs)
        return out

    def _token(self, request_id: str, position: int, banned: tuple[int, ...] = ()
               ) -> int | None:
        """The token at `position`; None when every token is EOS or banned."""
        span = self.vocab_size - self.first_token_id
        token = self.first_token_id + zlib.crc32(f"{request_id}:{position}".encode()) % span
        # never stop early on EOS (outputs run to max_tokens), nor on a stop token before
        # min_tokens; the next token up that is neither, at most once round the vocabulary
        skip = set(self.eos_token_ids).union(banned)
        for _ in range(span):
            if token not in skip:
                return token
            token = self.first_token_id + (token - self.first_token_id + 1) % span
        return None

    def release(self, request_id: str) -> None:
        pass

    def shutdown(self) -> None:
        pass
