"""Continuation affinity: a conversation's next turn goes where its last turn went.

A prompt that extends an earlier routed prompt (that prompt's last full block is one of
this prompt's blocks, not its last) is the next turn of a session. On cost alone some such
turns move: the load term outbids the cached history, or the history is evicted and the
load decides. Under memory pressure the moved history is then computed again and held
twice, and what it pushes out is missed later (SGLang's multi_turn, live: 0.955 of the
pooled bound for the cost alone, 0.988 for vllm-router's cache_aware, which never moves a
turn; benchmarks/results/bench_peers.txt).

Never moving a turn leaves a replica that drew the longest sessions with too much of the
work (the simulator's conversation ladder: load share 1.08 -> 1.80). The guard lets the
cost move a turn after all:
  - a session's first turns go by the cost if `min_turns` > 2 (off by default: on
    multi_turn, the turns the cost moves are early ones);
  - the replica's load is above `load_over_mean` x the candidates' mean load;
  - the replica holds more than `session_share` x the candidates' mean of the context
    tokens of the `session_window` sessions routed most recently;
  - the load the cost would shed by moving it (load_weight x the load gap to the cost's
    choice) is over `max_load_over_gain` x the prompt tokens it would not compute by
    staying. The cost moves a turn as soon as that load outbids its hit (a factor of 1);
    this guard asks for several times the hit, since a moved turn's history is then held
    twice and pushes out other sessions' later hits. A turn with nothing cached where its
    last went (its history evicted) has no hit to keep: the cost decides it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kv.hashing import BlockHash


@dataclass(frozen=True)
class ContinuationGuard:
    """When a session's next turn may leave the replica its last turn went to."""

    min_turns: int = 2  # affinity holds from this turn of a session on (1: the first)
    load_over_mean: float = 1.2  # that replica's load over the candidates' mean (inf: any)
    session_share: float = 1.2  # its recent sessions' tokens over the mean (inf: any)
    session_window: int = 64  # the most recently routed sessions that count
    max_prompts: int = 1 << 16  # sessions remembered (oldest forgotten: cost alone)
    # A turn that adds more blocks than this to the prompt it continues goes by the cost: the
    # walk for the parent costs ~85 ns a block (387 us on a 4,500-block prompt without it).
    # 256 blocks: the simulator's conversations add at most 3,500 tokens a turn.
    max_turn_blocks: int = 256
    # A turn stays only while the load it saves by moving, priced as the cost prices it
    # (load_weight x the load gap to the cost's choice), is at most this many times the
    # prefill tokens it saves by staying (inf: any). Off: with the two guards above at 3 it
    # gained conversation's top simulated rung but lost part of multi_turn's simulated gain,
    # and no live run on a quiet box has judged it (results/aff8_continuation_gain_guard.txt).
    max_load_over_gain: float = math.inf

    def __post_init__(self):
        if not isinstance(self.min_turns, int) or self.min_turns < 2:
            raise ValueError(f"ContinuationGuard.min_turns must be an integer >= 2 (a first "
                             f"turn continues nothing), got {self.min_turns!r}")
        for name in ("load_over_mean", "session_share", "max_load_over_gain"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ContinuationGuard.{name} must be > 0 (inf: no guard), "
                                 f"got {getattr(self, name)!r}")
        for name in ("session_window", "max_prompts", "max_turn_blocks"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"ContinuationGuard.{name} must be a positive integer, "
                                 f"got {getattr(self, name)!r}")


class _Prompt:
    """A routed prompt that a later turn may extend."""

    __slots__ = ("replica_id", "num_tokens", "turn")

    def __init__(self, replica_id: str, num_tokens: int, turn: int):
        self.replica_id = replica_id
        self.num_tokens = num_tokens
        self.turn = turn  # 1: the session's first prompt


class Continuations:
    """Where recent prompts went, keyed by their last full block; picks a continuation's
    replica (`follow`) and learns where each request went (`moved` when it landed elsewhere).
    State is bounded by `guard.max_prompts`; a forgotten session goes by the cost alone."""

    def __init__(self, guard: ContinuationGuard = ContinuationGuard()):
        self.guard = guard
        # a prompt's last full block -> the prompt, oldest first; a continued prompt's entry
        # gives way to its continuation's
        self._prompts: OrderedDict[BlockHash, _Prompt] = OrderedDict()
        # the `guard.session_window` newest entries, and their tokens per replica
        self._window: OrderedDict[BlockHash, _Prompt] = OrderedDict()
        self._window_tokens: dict[str, int] = {}
        self.num_kept = 0  # decisions where the continuation overruled the cost

    def follow(self, block_hashes: Sequence[BlockHash], num_prompt_tokens: int,
               replica_ids: Sequence[str], loads: np.ndarray, best: int,
               prefills: np.ndarray, load_weight: float) -> int:
        """The candidate (an index into `replica_ids`) the request goes to: `best`, the
        cost's choice, or the one the session's last turn went to when the guard allows.
        `loads` holds the candidates' loads in tokens and `prefills` the prompt tokens each
        would compute, in `replica_ids`' order; `load_weight` prices a token of load in
        prefill tokens, as the cost does."""
        chosen, turn = best, 1
        first = max(0, len(block_hashes) - 1 - self.guard.max_turn_blocks)
        for h in reversed(block_hashes[first:-1]):  # the longest earlier prompt first
            parent = self._prompts.get(h)
            if parent is None or parent.replica_id not in replica_ids:
                continue
            self._leave_window(h)  # the session counts once: as its continuation
            turn = parent.turn + 1
            at = replica_ids.index(parent.replica_id)
            if at != best and turn >= self.guard.min_turns and self._keeps(
                    at, best, replica_ids, loads, prefills, load_weight):
                chosen = at
                self.num_kept += 1
            break
        if block_hashes:
            self._remember(block_hashes[-1], _Prompt(replica_ids[chosen], num_prompt_tokens,
                                                      turn))
        return chosen

    def moved(self, block_hashes: Sequence[BlockHash], replica_id: str) -> None:
        """The request of these hashes runs on `replica_id`, not where it was ranked first:
        its next turn follows it there."""
        prompt = self._prompts.get(block_hashes[-1]) if block_hashes else None
        if prompt is None or prompt.replica_id == replica_id:
            return
        if block_hashes[-1] in self._window:
            self._window_tokens[prompt.replica_id] -= prompt.num_tokens
            self._window_tokens[replica_id] = (self._window_tokens.get(replica_id, 0)
                                               + prompt.num_tokens)
        prompt.replica_id = replica_id

    def _keeps(self, at: int, best: int, replica_ids: Sequence[str], loads: np.ndarray,
               prefills: np.ndarray, load_weight: float) -> bool:
        """Whether the continuation stays on candidate `at` though the cost prefers another."""
        g = self.guard
        if g.max_load_over_gain != math.inf:
            gain = float(prefills[best] - prefills[at])
            if load_weight * float(loads[at] - loads[best]) > g.max_load_over_gain * gain:
                return False
        if g.load_over_mean != math.inf and loads[at] > g.load_over_mean * float(loads.mean()):
            return False
        if g.session_share != math.inf:
            tokens = [self._window_tokens.get(rid, 0) for rid in replica_ids]
            if tokens[at] > g.session_share * sum(tokens) / len(tokens):
                return False
        return True

    def _remember(self, h: BlockHash, prompt: _Prompt) -> None:
        self._prompts[h] = prompt
        self._prompts.move_to_end(h)
        if len(self._prompts) > self.guard.max_prompts:
            self._prompts.popitem(last=False)
        self._leave_window(h)
        self._window[h] = prompt
        self._window_tokens[prompt.replica_id] = (self._window_tokens.get(prompt.replica_id, 0)
                                                  + prompt.num_tokens)
        if len(self._window) > self.guard.session_window:
            self._leave_window(next(iter(self._window)))

    def _leave_window(self, h: BlockHash) -> None:
        prompt = self._window.pop(h, None)
        if prompt is not None:
            self._window_tokens[prompt.replica_id] -= prompt.num_tokens

    def check_invariants(self) -> None:
        """The window's per-replica tokens are its entries' sums; both maps are bounded."""
        assert len(self._prompts) <= self.guard.max_prompts, len(self._prompts)
        assert len(self._window) <= self.guard.session_window, len(self._window)
        sums: dict[str, int] = {}
        for prompt in self._window.values():
            sums[prompt.replica_id] = sums.get(prompt.replica_id, 0) + prompt.num_tokens
        nonzero = {rid: n for rid, n in self._window_tokens.items() if n}
        assert nonzero == sums, (nonzero, sums)
