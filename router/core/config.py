"""The router core's one config (re-exported by router.core.router)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kv.hashing import DEFAULT_BLOCK_SIZE
from router.core.policies import POLICY_NAMES


@dataclass(frozen=True)
class RouterConfig:
    policy: str = "cache_aware"  # one of router.core.policies.POLICY_NAMES
    block_size: int = DEFAULT_BLOCK_SIZE  # tokens per block; must equal the engine's
    # Cost of one token of outstanding work, in prefill tokens (cache_aware). Heavier
    # weights split conversations off their cache; lighter ones break the balance
    # (benchmarks/NOTEBOOK.md, router findings 2 and 4, has the runs that chose it).
    load_weight: float = 0.2
    # A decode token's work in prefill tokens, in the load a request adds (cache_aware).
    decode_weight: float = 1.0
    # Each cached prompt token adds this many tokens of work to the load a request adds:
    # a cached prompt still costs its replica a seat and attention over its context.
    # (0.1: a burst of one cached prompt spreads like round robin; the what-ifs in
    # benchmarks/NOTEBOOK.md.)
    cached_load_fraction: float = 0.1
    # Pending marks cover the whole prompt, not only past its confirmed device run: the
    # request will hold all of it on its replica when it runs, so an eviction of the cached
    # part while it waits does not send the prompts that share it elsewhere. The confirmed
    # part is marked only once events show it evicted (router/core/pins.py), which costs a
    # decision nothing. (Mooncake at 2x: 0.991 of the bound, not 0.955; benchmarks/NOTEBOOK.md.)
    mark_whole_prompt: bool = True
    # > 0: a replica's load is at least the work routed to it lately, halving every this
    # many seconds (conversations between turns still count); 0: outstanding work only.
    # (30 s: conversations with think times spread; the what-ifs in benchmarks/NOTEBOOK.md.)
    recent_work_half_life_s: float = 30.0
    # A host hit costs this fraction of recomputing the block (it is copied back).
    host_cost_fraction: float = 0.2
    # Tokens of outstanding work by which the chosen replica may exceed the least loaded
    # before the cache gain must pay for the gap in full (cache_aware); inf (the default)
    # turns it off: with a guard, one long queued prompt pushes every conversation off its
    # cache (benchmarks/NOTEBOOK.md, router finding 2).
    imbalance_threshold: float = math.inf
    # A routed block counts as cached on its replica until an event confirms it, while its
    # request is outstanding and this long after it finished.
    pending_ttl_s: float = 2.0
    # A conversation's next turn goes where its last turn went, unless that replica carries
    # too much of the load or of the recent sessions (cache_aware;
    # router/core/policies/continuation.py): a turn moved on cost holds its history twice
    # under memory pressure.
    continuation_affinity: bool = False
    approximate: bool = False  # ignore events, use routed history only
    approx_capacity_blocks: int = 16384  # per replica, for approximate mode
    approx_ttl_s: float = 600.0  # a routed block is forgotten this long after its last use
    # Routed hashes replayed into the history per decision while the fallback warms up.
    fallback_warmup_blocks: int = 2048
    hash_prefix_blocks: int = 8  # consistent_hash keys on this many leading blocks
    # Block hashes the miss causes remember as seen (router.core.miss_causes.SeenWindow:
    # about 100 bytes each): a miss of a block not used within about half this many
    # distinct blocks counts as cold, not capacity. Several times the fleet's blocks.
    seen_window_blocks: int = 1 << 19
    seed: int = 0  # random policy

    def __post_init__(self):
        def bad(what: str) -> ValueError:
            return ValueError(f"RouterConfig: {what}")

        if self.policy not in POLICY_NAMES:
            raise bad(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICY_NAMES)}")
        if not isinstance(self.block_size, int) or self.block_size <= 0:
            raise bad(f"block_size must be a positive integer, got {self.block_size!r}")
        if not (math.isfinite(self.load_weight) and self.load_weight >= 0):
            raise bad(f"load_weight must be finite and >= 0, got {self.load_weight!r}")
        if not (math.isfinite(self.decode_weight) and self.decode_weight >= 0):
            raise bad(f"decode_weight must be finite and >= 0, got {self.decode_weight!r}")
        if not 0 <= self.cached_load_fraction <= 1:
            raise bad(f"cached_load_fraction must be in [0, 1], got "
                      f"{self.cached_load_fraction!r}")
        if not (math.isfinite(self.recent_work_half_life_s)
                and self.recent_work_half_life_s >= 0):
            raise bad(f"recent_work_half_life_s must be finite and >= 0, got "
                      f"{self.recent_work_half_life_s!r}")
        if not 0 <= self.host_cost_fraction <= 1:
            raise bad(f"host_cost_fraction must be in [0, 1], got {self.host_cost_fraction!r}")
        if not self.imbalance_threshold > 0:
            raise bad(f"imbalance_threshold must be > 0 tokens (inf: no guard), got "
                      f"{self.imbalance_threshold!r}")
        if not (math.isfinite(self.pending_ttl_s) and self.pending_ttl_s > 0):
            raise bad(f"pending_ttl_s must be finite and > 0, got {self.pending_ttl_s!r}")
        if not isinstance(self.approx_capacity_blocks, int) or self.approx_capacity_blocks <= 0:
            raise bad(f"approx_capacity_blocks must be a positive integer, got "
                      f"{self.approx_capacity_blocks!r}")
        if not (math.isfinite(self.approx_ttl_s) and self.approx_ttl_s > 0):
            raise bad(f"approx_ttl_s must be finite and > 0, got {self.approx_ttl_s!r}")
        if not isinstance(self.fallback_warmup_blocks, int) or self.fallback_warmup_blocks <= 0:
            raise bad(f"fallback_warmup_blocks must be a positive integer, got "
                      f"{self.fallback_warmup_blocks!r}")
        if not isinstance(self.hash_prefix_blocks, int) or self.hash_prefix_blocks <= 0:
            raise bad(f"hash_prefix_blocks must be a positive integer, got "
                      f"{self.hash_prefix_blocks!r}")
        if not isinstance(self.seen_window_blocks, int) or self.seen_window_blocks < 2:
            raise bad(f"seen_window_blocks must be an integer >= 2, got "
                      f"{self.seen_window_blocks!r}")
        if not isinstance(self.seed, int):
            raise bad(f"seed must be an integer, got {self.seed!r}")
