"""Outstanding work per replica, in tokens: what this router sent, and what the replica says.

A routed request adds its work (its uncached prefill tokens plus its decode tokens, as the
router weighs them) to its replica until `finish`. Its decode tokens are what it is expected
to produce (`decode_tokens`): the mean output length of the requests that ended here, or its
max_tokens when that is less; not its max_tokens, which a client may set far above what it
will use (a request asking for 4,000 tokens and producing 16 would otherwise weigh 250 of
its kind). The end reports the output tokens it really produced (`finish`): they teach the
mean and correct the replica's recent work to the work done. Before any end reported its
output, a request is charged its max_tokens.

A replica's published `EngineStats` also count work that other gateway processes sent:
queued prefill tokens plus running and waiting requests times the mean output length (the
mean decode charged, until an output is known).
The load is the larger of the two views: the local view counts a burst before the replica
reports it, the published one counts the other routers, and taking the max never counts
this router's own requests twice.

Every number that enters the load is bounded (`bounded_tokens`): a request's work and a
replica's published counts are clamped to `MAX_WORK_TOKENS`, so the load is always finite
and drops back when the request finishes or its recent work decays, whatever a client or a
worker sent (the entry points refuse such numbers before; this holds even if one does not).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import NamedTuple

import numpy as np

from protocol.engine import EngineStats

_DECODE_MEAN_ALPHA = 0.05  # weight of the newest request in the mean decode length
_OUTPUT_MEAN_ALPHA = 0.05  # weight of the newest end in the mean output length
# The most work one request, or one count of a replica's stats, adds (2^26, 67M tokens: 128
# sequences of a 512k-token context).
MAX_WORK_TOKENS = float(1 << 26)
# Replicas whose loads are read one by one, not as arrays, up to this many (2: 1.7 against
# 6.7 us with published stats, 1.3 against 2.4 without; even at about 8 without stats, 24
# with)
_LOADS_IN_PYTHON = 8
_NO_STATS = (math.nan, math.nan, math.nan)  # a replica that published none (see `loads`)


def bounded_tokens(tokens: float) -> float:
    """`tokens` clamped to [0, MAX_WORK_TOKENS]; NaN and negative counts are 0. Takes any
    int too (an int too large for a float is clamped, not converted)."""
    if not tokens > 0:
        return 0.0
    return MAX_WORK_TOKENS if tokens >= MAX_WORK_TOKENS else float(tokens)


class _Charge(NamedTuple):
    """What one outstanding request added to its replica."""

    replica_id: str
    work_tokens: float  # to its outstanding work, until it ends
    recent_tokens: float  # to its recent work, decaying from `routed_at_s`
    decode_tokens: float  # of `work_tokens`: the decode tokens it was expected to produce
    routed_at_s: float
    num_sequences: int = 1  # the completions it makes (n x the prompts of a batch)


class LoadTracker:
    def __init__(self, decode_weight: float = 1.0, recent_half_life_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.decode_weight = decode_weight  # a decode token's work in prefill tokens
        # > 0: a replica's load is at least the work routed to it lately, each request's
        # work halving every recent_half_life_s (see `load`)
        self.recent_half_life_s = recent_half_life_s
        self.clock = clock
        # replica -> its recent work scaled to `_epoch_s`: work routed at t counts
        # work x 2^((t - epoch) / half-life) here, so decaying all replicas to `now` is one
        # shared factor 2^(-(now - epoch) / half-life) (see `_decay`)
        self._recent: dict[str, float] = {}
        self._epoch_s = clock() if recent_half_life_s else 0.0
        self._decay_at: tuple[float, float] = (self._epoch_s, 1.0)  # (now, factor)
        self._requests: dict[str, _Charge] = {}  # request_id -> what it added
        self._local_tokens: dict[str, float] = {}  # replica -> sum of its requests' work
        self._num_local: dict[str, int] = {}  # replica -> outstanding request count
        # replica -> its published (queued prefill tokens, running, waiting), bounded
        self._stats: dict[str, tuple[float, float, float]] = {}
        self.mean_decode_tokens = 0.0  # of the decode tokens charged
        # of the output tokens the ended requests produced, per sequence (a request with
        # n = 8 makes 8 completions); None before the first is known
        self.mean_output_tokens: float | None = None

    def decode_tokens(self, max_tokens: float, num_sequences: int = 1) -> float:
        """The decode tokens to charge a request that may produce up to `max_tokens` over
        its `num_sequences` completions: each the mean output length, or its share of
        `max_tokens` when that is less or no output is known yet."""
        max_tokens = bounded_tokens(max_tokens)
        num_sequences = max(1, num_sequences)
        mean = self.mean_output_tokens
        if mean is None or mean * num_sequences > max_tokens:
            return max_tokens
        return mean * num_sequences

    def add(self, request_id: str, replica_id: str, work_tokens: float,
            decode_tokens: float, recent_tokens: float | None = None,
            num_sequences: int = 1) -> None:
        """Records a routed request; routing the same id again replaces its old entry.
        `decode_tokens`: the decode tokens counted in `work_tokens` (at `decode_weight`),
        which `finish` corrects to the output produced. `recent_tokens` (default: all of
        `work_tokens`) join the replica's recent work. `num_sequences`: its completions
        (its output teaches the mean per completion)."""
        self.finish(request_id)
        work_tokens = bounded_tokens(work_tokens)
        recent_tokens = (work_tokens if recent_tokens is None
                         else bounded_tokens(recent_tokens))
        decode_tokens = bounded_tokens(decode_tokens)
        now = self.clock() if self.recent_half_life_s else 0.0
        self._requests[request_id] = _Charge(replica_id, work_tokens, recent_tokens,
                                             decode_tokens, now, max(1, num_sequences))
        self._local_tokens[replica_id] = self._local_tokens.get(replica_id, 0.0) + work_tokens
        self._num_local[replica_id] = self._num_local.get(replica_id, 0) + 1
        if self.recent_half_life_s:
            self._recent[replica_id] = (self._recent.get(replica_id, 0.0)
                                        + recent_tokens / self._decay(now))
        self.mean_decode_tokens += _DECODE_MEAN_ALPHA * (decode_tokens - self.mean_decode_tokens)

    def finish(self, request_id: str, output_tokens: int | None = None) -> None:
        """Drops a finished request's work; unknown ids (already dropped) are ignored.
        `output_tokens`, what it produced when its end says (all its completions): the mean
        output length learns it per completion, and the replica's recent work counts it in
        place of the decode charged, as if it had been charged so when it was routed."""
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        replica_id, work_tokens = entry.replica_id, entry.work_tokens
        if output_tokens is not None:
            output_tokens = bounded_tokens(output_tokens)
            per_sequence = output_tokens / entry.num_sequences
            mean = self.mean_output_tokens
            self.mean_output_tokens = (per_sequence if mean is None
                                       else mean + _OUTPUT_MEAN_ALPHA * (per_sequence - mean))
            if entry.recent_tokens and replica_id in self._recent:
                self._add_recent(entry, self.decode_weight * (output_tokens
                                                              - entry.decode_tokens))
        n = self._num_local[replica_id] - 1
        if n:
            self._num_local[replica_id] = n
            self._local_tokens[replica_id] -= work_tokens
        else:  # reset exactly, so float sums cannot drift over a long run
            del self._num_local[replica_id]
            del self._local_tokens[replica_id]

    def withdraw(self, request_id: str) -> None:
        """Drops a request that did not go to the replica it was recorded on (a retry, a
        spill down the ranking): its work leaves the recent work there too."""
        entry = self._requests.get(request_id)
        if entry is None:
            return
        self.finish(request_id)
        if entry.replica_id in self._recent:
            self._add_recent(entry, -entry.recent_tokens)

    def _add_recent(self, entry: _Charge, tokens: float) -> None:
        """`tokens` (maybe negative) join the recent work of the entry's replica as if added
        when the entry was routed, scaled as `add` scaled its work then (so a withdraw takes
        back exactly what it added); the recent work stays >= 0."""
        self._decay(self.clock())  # moves the epoch first if it is due
        halvings = (entry.routed_at_s - self._epoch_s) / self.recent_half_life_s
        if halvings < -256:  # routed before the epoch moved: nothing of it is left
            return
        recent = self._recent[entry.replica_id] + tokens / 0.5 ** halvings
        self._recent[entry.replica_id] = max(0.0, recent)

    def update_stats(self, replica_id: str, stats: EngineStats) -> None:
        self._stats[replica_id] = (bounded_tokens(stats.num_queued_prefill_tokens),
                                   bounded_tokens(stats.num_running),
                                   bounded_tokens(stats.num_waiting))

    def published(self, replica_id: str) -> tuple[float, float, float] | None:
        """The replica's last published (queued prefill tokens, running, waiting), bounded;
        None before its first."""
        return self._stats.get(replica_id)

    def _decay(self, now: float) -> float:
        """2^(-(now - epoch) / half-life), computed once per clock reading; the epoch moves
        forward (every entry rescaled) before the scale could overflow."""
        at, factor = self._decay_at
        if now != at:
            halvings = (now - self._epoch_s) / self.recent_half_life_s
            if halvings > 256:
                rescale = 0.5 ** halvings
                self._recent = {r: v * rescale for r, v in self._recent.items()}
                self._epoch_s, halvings = now, 0.0
            factor = 0.5 ** halvings
            self._decay_at = (now, factor)
        return factor

    def load(self, replica_id: str) -> float:
        """Outstanding work on the replica, in tokens; with a recent-work half-life, at
        least the work routed to it lately (decayed): a replica whose conversations are
        between turns is idle now but will get their next turns."""
        return self._load(replica_id, (self._decay(self.clock()) if replica_id in self._recent
                                       else 1.0))

    def _load(self, replica_id: str, factor: float) -> float:
        """`load`, the recent work decayed by `factor` (`_decay` now)."""
        local = self._local_tokens.get(replica_id, 0.0)
        recent = self._recent.get(replica_id)
        if recent is not None:
            local = max(local, recent * factor)
        stats = self._stats.get(replica_id)
        if stats is None:
            return local
        queued_tokens, num_running, num_waiting = stats
        published = (queued_tokens
                     + self.decode_weight * (num_running + num_waiting) * self._mean_decode())
        return max(local, published)

    def _mean_decode(self) -> float:
        """Decode tokens per running or waiting request in a replica's published stats."""
        mean = self.mean_output_tokens
        return self.mean_decode_tokens if mean is None else mean

    def loads(self, replica_ids: Sequence[str]) -> np.ndarray:
        """`load` of each replica as one float64 array, the same numbers (the clock is read
        once for all): a ranking of hundreds of candidates makes no call per replica, and a
        few are read one by one (a dozen numpy calls cost more)."""
        n = len(replica_ids)
        if n <= _LOADS_IN_PYTHON:
            factor = self._decay(self.clock()) if self._recent else 1.0
            return np.array([self._load(rid, factor) for rid in replica_ids], np.float64)
        loads = np.fromiter(map(self._local_tokens.get, replica_ids, repeat(0.0)), np.float64, n)
        if self._recent:  # (NaN: no recent work there; fmax takes the other)
            recent = np.fromiter(map(self._recent.get, replica_ids, repeat(math.nan)),
                                 np.float64, n)
            loads = np.fmax(loads, recent * self._decay(self.clock()))
        if self._stats:
            stats = np.array([s or _NO_STATS for s in map(self._stats.get, replica_ids)],
                             np.float64).reshape(n, 3)
            queued_tokens, num_running, num_waiting = stats.T
            loads = np.fmax(loads, queued_tokens + self.decode_weight * (
                num_running + num_waiting) * self._mean_decode())
        return loads

    def num_outstanding(self, replica_id: str) -> int:
        """Requests this router sent to the replica and has not seen finish."""
        return self._num_local.get(replica_id, 0)

    def charge(self, request_id: str) -> tuple[float, float, float] | None:
        """(work tokens, decode tokens, recent tokens) the outstanding request added, as
        `add` took them, so that another router can add the same (router/cluster/
        remote_work.py); None when it is not outstanding."""
        entry = self._requests.get(request_id)
        return None if entry is None else (entry.work_tokens, entry.decode_tokens,
                                           entry.recent_tokens)

    def remove_replica(self, replica_id: str) -> None:
        """Forgets the replica's stats and its requests (their `finish` becomes a no-op)."""
        self._stats.pop(replica_id, None)
        self._recent.pop(replica_id, None)
        for rid in [r for r, c in self._requests.items() if c.replica_id == replica_id]:
            self.finish(rid)

    def check_invariants(self) -> None:
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for replica_id, work_tokens, *_ in self._requests.values():
            sums[replica_id] = sums.get(replica_id, 0.0) + work_tokens
            counts[replica_id] = counts.get(replica_id, 0) + 1
        assert counts == self._num_local, "outstanding counts != routed requests"
        assert sums.keys() == self._local_tokens.keys(), "outstanding work replicas drifted"
        for replica_id, total in sums.items():
            assert abs(total - self._local_tokens[replica_id]) <= 1e-6 * max(1.0, total), (
                f"{replica_id}: outstanding work {self._local_tokens[replica_id]} != {total}")
