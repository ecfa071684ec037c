"""sim_routing.py's ladders with the event-fed cache_aware router deciding by another rule.

    python benchmarks/peers/rule_ladder.py continuation_affinity --workload multi_turn \
        --replicas 8 --ladder --jobs 1 --out-dir /tmp/ladders --tag _cont

The first argument is a rule of benchmarks/peers/emulation.py (with a guard:
continuation_affinity:session_share=1.2, see emulation.rule); the rest go to
benchmarks/sim_routing.py unchanged. Every cache_aware router that is fed events (not the
approximate contender, not round robin) decides by the rule: a what-if on the workloads
and rates the simulator's routing targets are set on, before anything becomes a default.
Runs in this process: keep --jobs 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import sim_routing  # noqa: E402
from benchmarks.peers.emulation import RULES, install  # noqa: E402
from benchmarks.peers.emulation import rule as parse_rule  # noqa: E402
from benchmarks.simlib import experiment  # noqa: E402
from benchmarks.simlib.cluster import ClusterConfig, ClusterSim  # noqa: E402
from benchmarks.simlib.workloads import Workload  # noqa: E402


def with_rule(rule: str) -> type[ClusterSim]:
    class RuledSim(ClusterSim):
        def __init__(self, config: ClusterConfig, workload: Workload):
            super().__init__(config, workload)
            if config.router.policy == "cache_aware" and not config.router.approximate:
                install(self, rule)
    return RuledSim


def main(argv: list[str]) -> dict:
    if not argv:
        raise SystemExit(f"usage: rule_ladder.py RULE[:GUARD] [sim_routing.py args]; RULE "
                         f"one of {', '.join(RULES)}")
    try:
        parse_rule(argv[0])
    except ValueError as err:
        raise SystemExit(f"rule_ladder.py: {err}") from None
    if "--jobs" in argv and argv[argv.index("--jobs") + 1] != "1":
        raise SystemExit("rule_ladder.py runs in this process: --jobs 1")
    experiment.ClusterSim = with_rule(argv[0])
    return sim_routing.main(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
