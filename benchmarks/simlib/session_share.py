"""How evenly can whole conversation sessions be spread? Bounds on the load share.

The load share (benchmarks/simlib/report.py) is the busiest replica's computed tokens over
the mean replica's. A router that keeps each session on one replica (so every later turn
hits its cache) places sessions whole; with few sessions of unequal lengths the share then
depends on where each landed. From a run's `RequestRecord`s this module takes each turn's
work as a perfect cache would leave it (the first turn: its whole prompt and answer; a later
turn: the tokens its prompt added past the previous prompt and answer, and its answer) and
measures placements against it:

- `pack_offline`: sessions placed whole knowing their lengths (longest first onto the
  least loaded bin, then single moves and swaps off the busiest bin while they lower it).
  A feasible packing, so an upper bound on the best whole-session share.
- `place_online`: each session placed at its first turn, its length unknown, by a rule that
  sees only the work placed so far; with `move_slack`, a later turn whose replica's work is
  over (1 + slack) x the mean moves the session to the least loaded replica, which then
  recomputes the session's context (counted as work there, and as a lost hit).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Protocol


class _Record(Protocol):
    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int


class Turn(NamedTuple):
    arrival_s: float
    session: str
    work_tokens: int  # with the session's context cached: new prompt tokens + answer
    context_tokens: int  # the cached context before it (0 on the first turn)


class Placement(NamedTuple):
    load_share: float
    num_moves: int
    recomputed_tokens: int


def session_of(request_id: str) -> str:
    """`cv-s12-t3` -> `s12` (benchmarks/simlib/conversation.py's ids)."""
    parts = request_id.split("-")
    if len(parts) != 3 or not parts[1].startswith("s") or not parts[2].startswith("t"):
        raise ValueError(f"not a conversation turn id: {request_id!r}")
    return parts[1]


def turns_of(records: Iterable[_Record]) -> list[Turn]:
    """Every turn, in arrival order, with its work under a perfect cache."""
    by_session: dict[str, list[_Record]] = defaultdict(list)
    for rec in records:
        by_session[session_of(rec.request_id)].append(rec)
    turns = []
    for session, recs in by_session.items():
        recs.sort(key=lambda r: r.arrival_s)
        first = recs[0]
        turns.append(Turn(first.arrival_s, session,
                          first.num_prompt_tokens + first.num_output_tokens, 0))
        for prev, rec in zip(recs, recs[1:]):
            context = prev.num_prompt_tokens + prev.num_output_tokens
            turns.append(Turn(rec.arrival_s, session,
                              rec.num_prompt_tokens - context + rec.num_output_tokens, context))
    turns.sort()
    return turns


def session_work(turns: Iterable[Turn]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for t in turns:
        out[t.session] += t.work_tokens
    return dict(out)


def pack_offline(works: Sequence[float], num_bins: int) -> list[float]:
    """Bin totals of a whole-item packing (longest first, then improving moves and swaps
    off the busiest bin); max / mean of them is an upper bound on the best share."""
    bins: list[list[float]] = [[] for _ in range(num_bins)]
    for x in sorted(works, reverse=True):
        min(bins, key=sum).append(x)
    improved = True
    while improved:
        improved = False
        bins.sort(key=sum)
        top = bins[-1]
        top_sum = sum(top)
        for low in bins[:-1]:
            low_sum = sum(low)
            for i, x in enumerate(top):
                if low_sum + x < top_sum:
                    low.append(top.pop(i))
                    improved = True
                    break
                for j, y in enumerate(low):
                    if x > y and low_sum - y + x < top_sum:
                        top[i], low[j] = y, x
                        improved = True
                        break
                if improved:
                    break
            if improved:
                break
    return [sum(b) for b in bins]


Rule = Callable[[int, list[float]], int]  # (the session's index, work per replica) -> replica


def least_work(_: int, work: list[float]) -> int:
    return min(range(len(work)), key=lambda i: (work[i], i))


def round_robin(n: int, work: list[float]) -> int:
    return n % len(work)


def place_online(turns: Sequence[Turn], num_replicas: int, rule: Rule = least_work,
                 move_slack: float | None = None) -> Placement:
    """The share of placing sessions at their first turn by `rule` (see the module doc)."""
    replica_of: dict[str, int] = {}
    work = [0.0] * num_replicas
    num_moves = recomputed = 0
    for t in turns:
        extra = 0
        if t.session not in replica_of:
            replica_of[t.session] = rule(len(replica_of), work)
        elif move_slack is not None:
            mean = sum(work) / num_replicas
            if mean and work[replica_of[t.session]] > (1 + move_slack) * mean:
                replica_of[t.session] = least_work(0, work)
                num_moves += 1
                recomputed += t.context_tokens
                extra = t.context_tokens
        work[replica_of[t.session]] += t.work_tokens + extra
    mean = sum(work) / num_replicas
    return Placement(max(work) / mean if mean else 1.0, num_moves, recomputed)
