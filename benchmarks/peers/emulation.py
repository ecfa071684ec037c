"""Routing rules for simulator what-ifs beside kvroute's own (benchmarks/sim_peers.py).

- `PeerCacheAware`: the rule sglang-router's and vllm-router's cache_aware document,
  written from their docs: each replica's routed prompts (the router's own history, no
  events, never evicted here); a prompt whose longest routed prefix covers more than
  `threshold` of it goes to that replica, any other to the replica whose history holds the
  fewest blocks. Their balance override (in-flight requests: max - min > 64 and max > 1.5 x
  min) is left out: bench_peers' runs keep a few requests in flight a worker, far below it.
  Blocks, not characters: the same prefixes at block granularity.
- `continuation_affinity`: kvroute's cache_aware with RouterConfig.continuation_affinity
  (router/core/policies/continuation.py: a conversation's next turn goes where its last turn
  went) under another guard than the product's: none by default (`NO_GUARD`), or
  `rule("continuation_affinity:load_over_mean=1.2,session_share=1.2,min_turns=3")`.
  (Guards measured and dropped: the gain over the history left behind, the load over the
  mean of the busy candidates; benchmarks/results/bench_peers.txt.)

Both follow the policy contract (router.core.policies.base) and replace the policy of every
Router of a ClusterSim (`install`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields, replace

from benchmarks.simlib.cluster import ClusterSim
from kv.hashing import BlockHash
from router.core.config import RouterConfig
from router.core.policies import ReplicaView, RouteQuery
from router.core.policies.base import RankingPolicy
from router.core.policies.cache_aware import CacheAwarePolicy
from router.core.policies.continuation import ContinuationGuard


class PeerCacheAware(RankingPolicy):
    name = "peer_cache_aware"
    uses_index = False  # its own routed history only

    def __init__(self, config: RouterConfig, threshold: float = 0.3):
        if not 0 <= threshold <= 1:
            raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
        self.block_size = config.block_size
        self.threshold = threshold
        self.routed: dict[str, set[BlockHash]] = {}

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        ids = list(query.replica_ids)
        best, best_blocks = ids[0], 0
        for rid in ids:
            held = self.routed.setdefault(rid, set())
            n = 0
            for h in query.block_hashes:
                if h not in held:
                    break
                n += 1
            if n > best_blocks:
                best, best_blocks = rid, n
        if best_blocks * self.block_size <= self.threshold * query.num_prompt_tokens:
            best = min(ids, key=lambda rid: len(self.routed[rid]))  # ties: listed order
        self.routed[best].update(query.block_hashes)
        return [best] + [rid for rid in ids if rid != best]


# continuation_affinity with no guard: every continuation from the second turn on stays
NO_GUARD = ContinuationGuard(min_turns=2, load_over_mean=math.inf, session_share=math.inf)


def continuation_affinity(config: RouterConfig, guard: ContinuationGuard = NO_GUARD
                          ) -> CacheAwarePolicy:
    """kvroute's cache_aware with continuation affinity under `guard` (the product's code,
    router.core.policies.continuation; RouterConfig.continuation_affinity uses its default
    guard)."""
    return CacheAwarePolicy(replace(config, continuation_affinity=True), guard)


RULES: dict[str, Callable[[RouterConfig], RankingPolicy]] = {
    "peer_cache_aware": PeerCacheAware, "continuation_affinity": continuation_affinity}


def rule(spec: str) -> Callable[[RouterConfig], RankingPolicy]:
    """A rule by name, continuation_affinity with ContinuationGuard fields after a colon
    (the others as in NO_GUARD): "continuation_affinity:load_over_mean=1.2,min_turns=3"."""
    name, _, settings = spec.partition(":")
    make = RULES.get(name)
    if make is None:
        raise ValueError(f"unknown rule {spec!r}; choose one of {', '.join(RULES)}")
    if not settings:
        return make
    if make is not continuation_affinity:
        raise ValueError(f"rule {spec!r}: only continuation_affinity takes a guard")
    kinds = {f.name: f.type for f in fields(ContinuationGuard)}
    kw: dict[str, float | int] = {}
    for item in settings.split(","):
        key, _, value = item.partition("=")
        if key not in kinds or not value:
            raise ValueError(f"rule {spec!r}: want NAME=VALUE, NAME one of {', '.join(kinds)}")
        kw[key] = int(value) if kinds[key] == "int" else float(value)
    guard = replace(NO_GUARD, **kw)
    return lambda config: continuation_affinity(config, guard)


def install(sim: ClusterSim, spec: str) -> None:
    """Every router of `sim` decides by the rule `spec` names (`rule`), each with its own
    state."""
    make = rule(spec)
    for router in sim.routers:
        router.policy = make(router.config)
