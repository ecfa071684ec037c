"""The peers' published workloads as generators, shared by the simulator and the HTTP bench.

A workload is a list of `WorkItem`s: an arrival time, a prompt made of named `Segment`s
(each a deterministic block of token ids, see `prompts.TokenSource`; equal keys give equal
tokens) and an output length. A multi-turn round names its previous round (`parent_id`):
its prompt is that round's whole sequence (prompt + output) followed by its own segments,
and it is released no earlier than that round finished.

- generated_shared_prefix: SGLang bench_serving `generated-shared-prefix` (64 groups x 16
  prompts, 2048-token system prompt, 128-token question, 256 output tokens, shuffled, all at
  once by default).
- shared_prefix: llm-d / inference-perf `shared_prefix` (150 groups x 5 prompts, 6000-token
  system prompt, 1200-token question, 1000 output tokens, Poisson arrivals). As
  inference-perf does, the shuffled prompt list is sent over and over (request n sends
  prompt n mod 750), so a whole prompt recurs every 750 requests; llm-d's load stages each
  cover two to three such passes, and `passes` (default 3) sets how many a run sends.
- multi_turn: SGLang `bench_multiturn` (256 clients x 5 rounds, 512 new tokens a round,
  64 output tokens, the history resent every round).
- prefix_repetition: vLLM `prefix_repetition` (10 prefixes of 256, suffix 256, output 128).
- mooncake: replay of a Mooncake-format trace (timestamps in ms, one hash id per 512
  prompt tokens), arrivals divided by `time_scale`.
- burst: N identical long prompts at once, then (a wave later) N prompts that differ only
  in their last few tokens: the identical-prompt collapse.
- conversation: long multi-turn chats sharing a short system head, with think time
  (benchmarks/simlib/conversation.py).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WORKLOAD_NAMES = ("generated_shared_prefix", "shared_prefix", "multi_turn",
                  "prefix_repetition", "mooncake", "conversation", "burst")
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class Segment:
    key: str  # names the deterministic token block
    num_tokens: int  # its first num_tokens tokens are used


@dataclass(frozen=True)
class WorkItem:
    request_id: str
    arrival_s: float
    segments: tuple[Segment, ...]
    max_tokens: int
    parent_id: str | None = None  # multi-turn: the round this one continues
    think_s: float = 0.0  # multi-turn: released no earlier than this after the parent ends

    @property
    def num_new_prompt_tokens(self) -> int:
        return sum(s.num_tokens for s in self.segments)


@dataclass(frozen=True)
class Workload:
    name: str
    items: tuple[WorkItem, ...]  # parents before their children

    def __post_init__(self):
        seen: set[str] = set()
        for item in self.items:
            if item.request_id in seen:
                raise ValueError(f"{self.name}: duplicate request id {item.request_id}")
            if item.parent_id is not None and item.parent_id not in seen:
                raise ValueError(f"{self.name}: {item.request_id} continues "
                                 f"{item.parent_id}, which does not come before it")
            if item.max_tokens < 1 or item.num_new_prompt_tokens < 1:
                raise ValueError(f"{self.name}: {item.request_id} needs a prompt and >= 1 "
                                 "output token")
            seen.add(item.request_id)

    def shared_keys(self) -> frozenset[str]:
        """Segment keys used by more than one item (worth caching their tokens)."""
        counts = Counter(s.key for item in self.items for s in item.segments)
        return frozenset(k for k, n in counts.items() if n > 1)

    @property
    def num_requests(self) -> int:
        return len(self.items)


def poisson_arrivals_s(num: int, rate_qps: float, seed: int) -> np.ndarray:
    """Arrival times of a Poisson process at `rate_qps` (all at 0 when rate is inf)."""
    if not rate_qps > 0:
        raise ValueError(f"rate_qps must be > 0, got {rate_qps}")
    if math.isinf(rate_qps):
        return np.zeros(num)
    gaps = np.random.default_rng([seed, 1]).exponential(1.0 / rate_qps, num)
    return np.cumsum(gaps) - gaps[0]


def _grouped(name: str, num_groups: int, prompts_per_group: int, system_prompt_len: int,
             question_len: int, output_len: int, rate_qps: float, seed: int,
             passes: int = 1) -> Workload:
    """Each group's system prompt followed by one of its questions, in one shuffled order;
    `passes` times over that order (request n sends prompt n mod the prompt count)."""
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    pairs = [(g, i) for g in range(num_groups) for i in range(prompts_per_group)]
    order = np.random.default_rng([seed, 0]).permutation(len(pairs))
    arrivals = poisson_arrivals_s(passes * len(pairs), rate_qps, seed)
    items = []
    for n in range(passes * len(pairs)):
        g, i = pairs[order[n % len(pairs)]]
        items.append(WorkItem(
            f"{name[:3]}-{n}", float(arrivals[n]),
            (Segment(f"{name}/sys{g}", system_prompt_len),
             Segment(f"{name}/q{g}.{i}", question_len)), output_len))
    return Workload(name, tuple(items))


def generated_shared_prefix(num_groups: int = 64, prompts_per_group: int = 16,
                            system_prompt_len: int = 2048, question_len: int = 128,
                            output_len: int = 256, rate_qps: float = math.inf,
                            seed: int = 0) -> Workload:
    return _grouped("generated_shared_prefix", num_groups, prompts_per_group,
                    system_prompt_len, question_len, output_len, rate_qps, seed)


def shared_prefix(num_groups: int = 150, prompts_per_group: int = 5,
                  system_prompt_len: int = 6000, question_len: int = 1200,
                  output_len: int = 1000, rate_qps: float = 8.0, seed: int = 0,
                  passes: int = 3) -> Workload:
    return _grouped("shared_prefix", num_groups, prompts_per_group, system_prompt_len,
                    question_len, output_len, rate_qps, seed, passes)


def prefix_repetition(num_prompts: int = 1000, num_prefixes: int = 10, prefix_len: int = 256,
                      suffix_len: int = 256, output_len: int = 128, rate_qps: float = math.inf,
                      seed: int = 0) -> Workload:
    rng = np.random.default_rng([seed, 0])
    prefix_of = rng.integers(0, num_prefixes, num_prompts)
    arrivals = poisson_arrivals_s(num_prompts, rate_qps, seed)
    items = tuple(
        WorkItem(f"pre-{n}", float(arrivals[n]),
                 (Segment(f"prefix_repetition/p{prefix_of[n]}", prefix_len),
                  Segment(f"prefix_repetition/s{n}", suffix_len)), output_len)
        for n in range(num_prompts))
    return Workload("prefix_repetition", items)


def multi_turn(num_clients: int = 256, num_rounds: int = 5, request_len: int = 512,
               output_len: int = 64, rate_qps: float = 16.0, seed: int = 0) -> Workload:
    """Round r takes the Poisson ticks r * num_clients ... (r + 1) * num_clients - 1, its
    clients in a random order (a fixed order would let round robin keep every client on
    one replica whenever the replica count divides the client count); a round is released
    no earlier than the same client's previous round finished."""
    arrivals = poisson_arrivals_s(num_clients * num_rounds, rate_qps, seed)
    rng = np.random.default_rng([seed, 2])
    items = []
    for r in range(num_rounds):
        for k, c in enumerate(rng.permutation(num_clients)):
            items.append(WorkItem(
                f"mt-c{c}-r{r}", float(arrivals[r * num_clients + k]),
                (Segment(f"multi_turn/c{c}.r{r}", request_len),), output_len,
                parent_id=f"mt-c{c}-r{r - 1}" if r else None))
    return Workload("multi_turn", tuple(items))


def burst(num_prompts: int = 400, prompt_len: int = 2048, tail_len: int = 8,
          output_len: int = 16, wave_gap_s: float = 60.0) -> Workload:
    """Wave 1 at 0 s: `num_prompts` copies of one `prompt_len`-token prompt. Wave 2 at
    `wave_gap_s`: `num_prompts` prompts that share their first `prompt_len - tail_len`
    tokens (another text than wave 1's) and differ in the last `tail_len`. Short answers
    (a classification or extraction fan-out): the load a cached prompt adds is then only
    its few decode tokens, which is what collapsed such bursts onto one replica."""
    if not 0 < tail_len < prompt_len:
        raise ValueError(f"tail_len must be in (0, prompt_len), got {tail_len}")
    same = tuple(WorkItem(f"bu-same-{n}", 0.0, (Segment("burst/same", prompt_len),),
                          output_len) for n in range(num_prompts))
    near = tuple(
        WorkItem(f"bu-near-{n}", wave_gap_s,
                 (Segment("burst/near", prompt_len - tail_len),
                  Segment(f"burst/tail{n}", tail_len)), output_len)
        for n in range(num_prompts))
    return Workload("burst", same + near)


def mooncake(path: str | Path, time_scale: float = 1.0, max_requests: int | None = None,
             family_modulus: int = 1, family_residue: int = 0) -> Workload:
    """A Mooncake-format trace. Hash id h becomes segment `mooncake/h` (512 tokens); the
    last one is cut to the input length. Arrivals are `timestamp / 1000 / time_scale` s.

    `family_modulus` > 1 keeps only the requests whose first hash id is `family_residue`
    modulo it: whole prefix families (every request that can share a prefix with a kept
    one is kept), so a fraction of the trace keeps its sharing; arrivals then count from
    the first kept request."""
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    if not 0 <= family_residue < family_modulus:
        raise ValueError(f"family_residue must be in [0, family_modulus), got "
                         f"{family_residue}, {family_modulus}")
    items = []
    t0_ms: float | None = None
    with open(path) as f:
        for n, line in enumerate(f):
            if max_requests is not None and len(items) >= max_requests:
                break
            row = json.loads(line)
            if row["hash_ids"] and row["hash_ids"][0] % family_modulus != family_residue:
                continue
            if t0_ms is None:
                t0_ms = row["timestamp"] if family_modulus > 1 else 0.0
            ids, num_tokens = row["hash_ids"], int(row["input_length"])
            if len(ids) != -(-num_tokens // MOONCAKE_BLOCK_TOKENS):
                raise ValueError(f"{path}:{n + 1}: {len(ids)} hash ids for {num_tokens} "
                                 f"tokens at {MOONCAKE_BLOCK_TOKENS} tokens an id")
            last = num_tokens - MOONCAKE_BLOCK_TOKENS * (len(ids) - 1)
            segs = tuple(Segment(f"mooncake/{h}", MOONCAKE_BLOCK_TOKENS) for h in ids[:-1])
            items.append(WorkItem(f"mc-{n}", (row["timestamp"] - t0_ms) / 1000.0 / time_scale,
                                  segs + (Segment(f"mooncake/{ids[-1]}", last),),
                                  max(1, int(row["output_length"]))))
    return Workload("mooncake", tuple(items))
