"""The `conversation` workload: long multi-turn chats that share only a short system head.

Shaped like the public multi-turn chat traces (ShareGPT, LMSYS-Chat-1M conversations):
- sessions start as a Poisson process; each turn after the first is sent a think time
  (exponential) after the previous answer ended;
- each turn's prompt is the previous prompt, plus the answer, plus the new user message
  (`WorkItem.parent_id`), so a session's context grows turn by turn;
- every session starts with the same short system head (`system_len` tokens: one or two
  blocks), the only thing sessions share;
- messages and answers have log-normal lengths; a session ends with probability
  `end_probability` after each turn, and at the latest when its next turn would pass
  `max_context_tokens` (about 10k).

`rate_qps` sets how many sessions start within `duration_s`: as many as hold
`rate_qps x duration_s` turns.
"""

from __future__ import annotations

import numpy as np

from benchmarks.simlib.workloads import Segment, WorkItem, Workload, poisson_arrivals_s


def _lognormal_lengths(rng: np.random.Generator, mean_tokens: float, sigma: float,
                       low: int, high: int, size: int) -> np.ndarray:
    mu = np.log(mean_tokens) - sigma * sigma / 2  # so that the mean is mean_tokens
    return np.clip(rng.lognormal(mu, sigma, size), low, high).astype(int)


def _session(rng: np.random.Generator, system_len: int, message_mean_tokens: float,
             output_mean_tokens: float, think_mean_s: float, end_probability: float,
             max_context_tokens: int) -> list[tuple[int, int, float]]:
    """One session's turns: (message tokens, answer tokens, think seconds before it)."""
    messages = _lognormal_lengths(rng, message_mean_tokens, 1.0, 8, 2000, 64)
    outputs = _lognormal_lengths(rng, output_mean_tokens, 0.7, 16, 1500, 64)
    thinks = rng.exponential(think_mean_s, 64)
    ends = rng.random(64) < end_probability
    context, turns = system_len, []
    for t in range(64):
        if context + messages[t] + outputs[t] > max_context_tokens:
            break
        turns.append((int(messages[t]), int(outputs[t]), float(thinks[t]) if t else 0.0))
        context += messages[t] + outputs[t]
        if ends[t]:
            break
    return turns


def conversation(rate_qps: float = 2.0, duration_s: float = 480.0, system_len: int = 24,
                 message_mean_tokens: float = 250.0, output_mean_tokens: float = 250.0,
                 think_mean_s: float = 20.0, end_probability: float = 0.04,
                 max_context_tokens: int = 10_000, seed: int = 0) -> Workload:
    """Sessions (the same ones, in the same order, at every rate) until they hold
    `rate_qps x duration_s` turns; they start as a Poisson process over `duration_s`. A
    turn's `arrival_s` is its session's start plus the think times before it: the earliest
    it can be sent (it waits for the previous answer too)."""
    if not 0 <= end_probability < 1:
        raise ValueError(f"end_probability must be in [0, 1), got {end_probability}")
    if not 0 < system_len < max_context_tokens:
        raise ValueError(f"system_len must be in (0, max_context_tokens), got {system_len}")
    if not (rate_qps > 0 and duration_s > 0):
        raise ValueError(f"rate_qps and duration_s must be > 0, got {rate_qps}, {duration_s}")
    rng = np.random.default_rng([seed, 3])
    sessions: list[list[tuple[int, int, float]]] = []
    num_turns = 0
    while num_turns < rate_qps * duration_s:
        sessions.append(_session(rng, system_len, message_mean_tokens, output_mean_tokens,
                                 think_mean_s, end_probability, max_context_tokens))
        num_turns += len(sessions[-1])
    starts = poisson_arrivals_s(len(sessions), len(sessions) / duration_s, seed)
    items = []
    for s, turns in enumerate(sessions):
        at_s = float(starts[s])
        for t, (message, output, think_s) in enumerate(turns):
            at_s += think_s
            new = (Segment(f"conversation/s{s}.t{t}", message),)
            if t == 0:
                items.append(WorkItem(f"cv-s{s}-t0", at_s,
                                      (Segment("conversation/sys", system_len),) + new,
                                      output))
            else:
                items.append(WorkItem(f"cv-s{s}-t{t}", at_s, new, output,
                                      parent_id=f"cv-s{s}-t{t - 1}", think_s=think_s))
    return Workload("conversation", tuple(items))
