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
  A `Guard` lets the cost move it after all: when that replica's load is too far above the
  candidates' mean, when moving gains more than the history it leaves behind (hysteresis),
  or when that replica holds too large a share of the recent sessions' context tokens.
  `rule("continuation_affinity:load_over_mean=1.2,session_share=1.2")` names one.

All follow the policy contract (router.core.policies.base) and replace the policy of every
Router of a ClusterSim (`install`). Neither is a kvroute setting.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields

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


@dataclass(frozen=True)
class Guard:
    """When a continuation may leave the replica its last turn went to (inf: never)."""

    # that replica's load over the candidates' mean load
    load_over_mean: float = math.inf
    # the cost gained by moving over the cached history it leaves behind on that replica
    gain_over_history: float = math.inf
    # that replica's share of the recent sessions' context tokens, over the mean share
    session_share: float = math.inf
    session_window: int = 64  # the most recently routed sessions that count

    def __post_init__(self):
        for f in ("load_over_mean", "gain_over_history", "session_share"):
            if not getattr(self, f) > 0:
                raise ValueError(f"Guard.{f} must be > 0, got {getattr(self, f)!r}")
        if self.session_window < 1:
            raise ValueError(f"Guard.session_window must be >= 1, got {self.session_window!r}")


class ContinuationAffinity(RankingPolicy):
    name = "cache_aware"
    uses_index = True

    def __init__(self, config: RouterConfig, guard: Guard = Guard(),
                 remembered_prompts: int = 1 << 16):
        if remembered_prompts < 1:
            raise ValueError(f"remembered_prompts must be >= 1, got {remembered_prompts!r}")
        self.inner = CacheAwarePolicy(config)
        self.guard = guard
        self.remembered_prompts = remembered_prompts
        # a routed prompt's last full block -> (where the prompt went, its tokens), oldest
        # first; a continued prompt's entry gives way to its continuation's
        self.last_block: OrderedDict[BlockHash, tuple[str, int]] = OrderedDict()
        # the `guard.session_window` newest entries, and their tokens per replica
        self.recent: OrderedDict[BlockHash, tuple[str, int]] = OrderedDict()
        self.session_tokens: dict[str, float] = {}
        self.num_kept = 0  # decisions where the continuation overruled the cost

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        order = self.inner.rank(query, view)
        hashes = query.block_hashes
        for h in reversed(hashes[:-1]):  # the longest earlier prompt first
            entry = self.last_block.get(h)
            if entry is not None and entry[0] in query.replica_ids:
                self._leave_window(h)  # the session counts once: as its continuation
                rid = entry[0]
                if rid != order[0] and self._keeps(rid, order[0], query, view):
                    self._move_credit(order[0], rid, query, view)
                    order = [rid] + [r for r in order if r != rid]
                    self.num_kept += 1
                break
        if hashes:
            self._remember(hashes[-1], order[0], query.num_prompt_tokens)
        return order

    def _remember(self, h: BlockHash, rid: str, tokens: int) -> None:
        self.last_block[h] = (rid, tokens)
        self.last_block.move_to_end(h)
        if len(self.last_block) > self.remembered_prompts:
            self.last_block.popitem(last=False)
        self._leave_window(h)
        self.recent[h] = (rid, tokens)
        self.session_tokens[rid] = self.session_tokens.get(rid, 0.0) + tokens
        if len(self.recent) > self.guard.session_window:
            self._leave_window(next(iter(self.recent)))

    def _leave_window(self, h: BlockHash) -> None:
        entry = self.recent.pop(h, None)
        if entry is not None:
            self.session_tokens[entry[0]] -= entry[1]

    def _keeps(self, rid: str, best: str, query: RouteQuery, view: ReplicaView) -> bool:
        """Whether the continuation stays on `rid` though the cost prefers `best`."""
        g = self.guard
        ids = query.replica_ids
        if g.load_over_mean != math.inf:
            mean = sum(map(view.load, ids)) / len(ids)
            if view.load(rid) > g.load_over_mean * mean:
                return False
        if g.gain_over_history != math.inf:
            n = query.num_prompt_tokens
            prefill = {r: self.inner.prefill_cost_tokens(view.matches.get(r), n)
                       for r in (rid, best)}
            gain = (prefill[rid] + self.inner.load_weight * view.load(rid)
                    - prefill[best] - self.inner.load_weight * view.load(best))
            if gain > g.gain_over_history * (n - prefill[rid]):
                return False
        if g.session_share != math.inf:
            mean = sum(self.session_tokens.get(r, 0.0) for r in ids) / len(ids)
            if self.session_tokens.get(rid, 0.0) > g.session_share * mean:
                return False
        return True

    def _move_credit(self, src: str, dst: str, query: RouteQuery, view: ReplicaView) -> None:
        """The routed work the inner policy counted on `src` (its tie-break) goes to `dst`."""
        routed = self.inner._routed_tokens
        for rid, sign in ((src, -1.0), (dst, 1.0)):
            prefill = self.inner.prefill_cost_tokens(view.matches.get(rid),
                                                     query.num_prompt_tokens)
            routed[rid] = routed.get(rid, 0.0) + sign * (prefill + query.max_tokens)


RULES: dict[str, Callable[[RouterConfig], RankingPolicy]] = {
    "peer_cache_aware": PeerCacheAware, "continuation_affinity": ContinuationAffinity}


def rule(spec: str) -> Callable[[RouterConfig], RankingPolicy]:
    """A rule by name, continuation_affinity with a Guard's fields after a colon:
    "continuation_affinity:load_over_mean=1.2,session_window=32"."""
    name, _, settings = spec.partition(":")
    make = RULES.get(name)
    if make is None:
        raise ValueError(f"unknown rule {spec!r}; choose one of {', '.join(RULES)}")
    if not settings:
        return make
    if make is not ContinuationAffinity:
        raise ValueError(f"rule {spec!r}: only continuation_affinity takes a guard")
    kinds = {f.name: f.type for f in fields(Guard)}
    kw: dict[str, float | int] = {}
    for item in settings.split(","):
        key, _, value = item.partition("=")
        if key not in kinds or not value:
            raise ValueError(f"rule {spec!r}: want NAME=VALUE, NAME one of {', '.join(kinds)}")
        kw[key] = int(value) if kinds[key] == "int" else float(value)
    guard = Guard(**kw)
    return lambda config: ContinuationAffinity(config, guard)


def install(sim: ClusterSim, spec: str) -> None:
    """Every router of `sim` decides by the rule `spec` names (`rule`), each with its own
    state."""
    make = rule(spec)
    for router in sim.routers:
        router.policy = make(router.config)
