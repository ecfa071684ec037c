"""Routing rules for simulator what-ifs beside kvroute's own (benchmarks/sim_peers.py).

- `PeerCacheAware`: the rule sglang-router's and vllm-router's cache_aware document,
  written from their docs: each replica's routed prompts (the router's own history, no
  events, never evicted here); a prompt whose longest routed prefix covers more than
  `threshold` of it goes to that replica, any other to the replica whose history holds the
  fewest blocks. Their balance override (in-flight requests: max - min > 64 and max > 1.5 x
  min) is left out: bench_peers' runs keep a few requests in flight a worker, far below it.
  Blocks, not characters: the same prefixes at block granularity.
- `ContinuationAffinity`: kvroute's cache_aware, except that a prompt extending an earlier
  routed prompt (that prompt's last full block is one of this prompt's, not its last: the
  next turn of a conversation) goes where the longest such prompt went, whatever the load.

Both follow the policy contract (router.core.policies.base) and replace the policy of every
Router of a ClusterSim (`install`). Neither is a kvroute setting.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from benchmarks.simlib.cluster import ClusterSim
from kv.hashing import BlockHash
from router.core.config import RouterConfig
from router.core.policies import ReplicaView, RouteQuery
from router.core.policies.base import RankingPolicy
from router.core.policies.cache_aware import CacheAwarePolicy


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


class ContinuationAffinity(RankingPolicy):
    name = "cache_aware"
    uses_index = True

    def __init__(self, config: RouterConfig, remembered_prompts: int = 1 << 16):
        if remembered_prompts < 1:
            raise ValueError(f"remembered_prompts must be >= 1, got {remembered_prompts!r}")
        self.inner = CacheAwarePolicy(config)
        self.remembered_prompts = remembered_prompts
        # a routed prompt's last full block -> where the prompt went (oldest first)
        self.last_block: OrderedDict[BlockHash, str] = OrderedDict()
        self.num_kept = 0  # decisions where the continuation overruled the cost

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        order = self.inner.rank(query, view)
        hashes = query.block_hashes
        for h in reversed(hashes[:-1]):  # the longest earlier prompt first
            rid = self.last_block.get(h)
            if rid is not None and rid in query.replica_ids:
                if rid != order[0]:
                    self._move_credit(order[0], rid, query, view)
                    order = [rid] + [r for r in order if r != rid]
                    self.num_kept += 1
                break
        if hashes:
            self.last_block[hashes[-1]] = order[0]
            self.last_block.move_to_end(hashes[-1])
            if len(self.last_block) > self.remembered_prompts:
                self.last_block.popitem(last=False)
        return order

    def _move_credit(self, src: str, dst: str, query: RouteQuery, view: ReplicaView) -> None:
        """The routed work the inner policy counted on `src` (its tie-break) goes to `dst`."""
        routed = self.inner._routed_tokens
        for rid, sign in ((src, -1.0), (dst, 1.0)):
            prefill = self.inner.prefill_cost_tokens(view.matches.get(rid),
                                                     query.num_prompt_tokens)
            routed[rid] = routed.get(rid, 0.0) + sign * (prefill + query.max_tokens)


RULES: dict[str, Callable[[RouterConfig], RankingPolicy]] = {
    "peer_cache_aware": PeerCacheAware, "continuation_affinity": ContinuationAffinity}


def install(sim: ClusterSim, rule: str) -> None:
    """Every router of `sim` decides by `rule` (one of RULES), each with its own state."""
    make = RULES.get(rule)
    if make is None:
        raise ValueError(f"unknown rule {rule!r}; choose one of {', '.join(RULES)}")
    for router in sim.routers:
        router.policy = make(router.config)
