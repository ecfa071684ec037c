"""Conversation's load share against whole-session placements (benchmarks/NOTEBOOK.md).

    python benchmarks/conversation_share.py --rate 0.125 --rate 0.25

Runs the conversation workload (8 replicas, its default capacity, the default RouterConfig)
at each rate per replica, then prints the router's load share beside the shares of
placements computed from the same turns (benchmarks/simlib/session_share.py): sessions
packed whole knowing their lengths, placed online at their first turn without moves (least
work so far, round robin, random), and placed online with moves at a slack, with the
context tokens the moves recompute.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simlib import experiment as ex  # noqa: E402
from benchmarks.simlib import session_share as ss  # noqa: E402
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim  # noqa: E402
from benchmarks.simlib.replica import ReplicaConfig  # noqa: E402
from router.core.config import RouterConfig  # noqa: E402


def random_rule(seed: int) -> ss.Rule:
    rng = random.Random(seed)
    return lambda _, work: rng.randrange(len(work))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, action="append", required=True,
                   help="req/s per replica (the ladder's rungs)")
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--random-seeds", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="a smoke-test size only")
    args = p.parse_args(argv)
    n = args.replicas
    capacity = ex.DEFAULTS["conversation"].num_blocks
    for rate in args.rate:
        workload = ex.build_workload("conversation", rate, n, quick=args.quick)
        run = ClusterSim(ClusterConfig(n, ReplicaConfig(num_blocks=capacity), RouterConfig()),
                         workload).run()
        work = [rep.num_tokens_computed for rep in run.replicas]
        turns = ss.turns_of(run.records)
        sessions = ss.session_work(turns)
        prompt_tokens = sum(r.num_prompt_tokens for r in run.records)
        packed = ss.pack_offline(list(sessions.values()), n)
        mean = sum(sessions.values()) / n
        print(f"conversation at {rate} req/s a replica: {len(sessions)} sessions, "
              f"{len(turns)} turns; the longest session is {max(sessions.values()) / mean:.3f} "
              f"of a replica's mean work")
        print(f"  router (default RouterConfig)          share {max(work) * n / sum(work):.3f}")
        print(f"  whole sessions, lengths known          share {max(packed) / mean:.3f}")
        for label, rule in (("least work so far", ss.least_work),
                            ("round robin", ss.round_robin)):
            print(f"  online, never moved, {label:<18}share "
                  f"{ss.place_online(turns, n, rule).load_share:.3f}")
        shares = sorted(ss.place_online(turns, n, random_rule(seed)).load_share
                        for seed in range(args.random_seeds))
        print(f"  online, never moved, random            share median "
              f"{statistics.median(shares):.3f} over {args.random_seeds} seeds")
        for slack in (0.3, 0.2, 0.1, 0.05):
            moved = ss.place_online(turns, n, ss.least_work, move_slack=slack)
            print(f"  online, moves over {slack:<4} x the mean     share {moved.load_share:.3f}, "
                  f"{moved.num_moves} moves recompute {moved.recomputed_tokens / prompt_tokens:.3f}"
                  f" of the prompt tokens")


if __name__ == "__main__":
    main()
