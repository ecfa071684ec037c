"""Where each router sent each multi_turn turn, from bench_peers' raw runs (--record-events).

    python benchmarks/peers/placements.py RUN.jsonl [RUN.jsonl ...]

Each run's requests carry the worker that ran their prefill (event_recorder.serving_workers).
Per run: hit rate by round, the turns that left their session's last worker (moved), and
how the sessions' first turns spread over the workers. Runs of the same seed (the same
requests) are then compared request by request against the first run of that seed given:
the cached tokens each router got, summed by round and by whether each router moved the
turn, so that a loss shows where it comes from.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

_TURN = re.compile(r"^mt-c(\d+)-r(\d+)$")


def load(path: Path) -> tuple[dict, dict[str, dict]]:
    with open(path) as f:
        summary = json.loads(f.readline())
        return summary, {r["request_id"]: r for r in map(json.loads, f)}


def turns(records: dict[str, dict]) -> dict[int, list[dict]]:
    """Client -> its requests by round."""
    out: dict[int, list[dict]] = defaultdict(list)
    for rid, r in records.items():
        m = _TURN.match(rid)
        if m:
            out[int(m[1])].append({**r, "round": int(m[2])})
    return {c: sorted(rs, key=lambda r: r["round"]) for c, rs in out.items()}


def moved(records: dict[str, dict]) -> set[str]:
    """The turns that ran on another worker than their session's previous turn (both known)."""
    out = set()
    for rs in turns(records).values():
        for prev, cur in zip(rs, rs[1:]):
            if None not in (prev.get("worker"), cur.get("worker")) \
                    and prev["worker"] != cur["worker"]:
                out.add(cur["request_id"])
    return out


def describe(summary: dict, records: dict[str, dict]) -> list[str]:
    by_round: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for rs in turns(records).values():
        for r in rs:
            by_round[r["round"]][0] += r["cached_tokens"]
            by_round[r["round"]][1] += r["prompt_tokens"]
    firsts = Counter(rs[0].get("worker") for rs in turns(records).values())
    last_tokens: Counter = Counter()
    for rs in turns(records).values():
        last_tokens[rs[-1].get("worker")] += rs[-1]["prompt_tokens"]
    rates = " ".join(f"r{k} {c / p:.3f}" for k, (c, p) in sorted(by_round.items()))
    return [f"{summary['router']} seed {summary['seed']}: hit {summary['cached_token_rate']:.4f}"
            f" bound {summary['bound_hit_rate']:.4f} share {summary['load_share']:.3f}; "
            f"by round {rates}",
            f"  moved turns {len(moved(records))}; sessions started per worker "
            f"{dict(sorted(firsts.items(), key=str))}; last turns' prompt tokens per worker "
            f"{dict(sorted(last_tokens.items(), key=str))}"]


def compare(base: tuple[dict, dict], other: tuple[dict, dict]) -> list[str]:
    """`other`'s cached tokens minus `base`'s, request by request, by round and moves."""
    (bs, br), (os_, or_) = base, other
    bm, om = moved(br), moved(or_)
    diff: Counter = Counter()
    count: Counter = Counter()
    for rid, b in br.items():
        o = or_.get(rid)
        m = _TURN.match(rid)
        if o is None or m is None:
            continue
        key = (int(m[2]), rid in bm, rid in om)
        diff[key] += o["cached_tokens"] - b["cached_tokens"]
        count[key] += 1
    total = sum(r["prompt_tokens"] for r in br.values())
    lines = [f"  {os_['router']} - {bs['router']} (seed {bs['seed']}): cached tokens "
             f"{sum(diff.values()):+d} ({sum(diff.values()) / total:+.4f} of the prompt tokens)"
             f"; by (round, {bs['router']} moved, {os_['router']} moved):"]
    for key in sorted(diff):
        lines.append(f"    r{key[0]} {'moved' if key[1] else 'stayed'}/"
                     f"{'moved' if key[2] else 'stayed'}: {count[key]:>3} turns, "
                     f"{diff[key]:+7d} tokens")
    lines.append(f"  TTFT p50 / p90 by round, {bs['router']} then {os_['router']} (s):")
    for rnd in sorted({k[0] for k in diff}):
        pair = [(b, or_[rid]) for rid, b in br.items() if rid in or_
                and (m := _TURN.match(rid)) and int(m[2]) == rnd]
        lines.append(f"    r{rnd}: {_ttft([b for b, _ in pair])}  {_ttft([o for _, o in pair])}")
    return lines


def _ttft(records: list[dict]) -> str:
    xs = sorted(r["first_chunk_s"] - r["sent_s"] for r in records)
    return f"{xs[len(xs) // 2]:.3f} / {xs[max(0, math.ceil(0.9 * len(xs)) - 1)]:.3f}"


def main(paths: list[str]) -> None:
    runs = [load(Path(p)) for p in paths]
    first_of_seed: dict[int, tuple[dict, dict]] = {}
    for run in runs:
        print("\n".join(describe(*run)))
        seed = run[0]["seed"]
        if seed in first_of_seed:
            print("\n".join(compare(first_of_seed[seed], run)))
        else:
            first_of_seed[seed] = run


if __name__ == "__main__":
    main(sys.argv[1:])
