"""kvroute's prefix-cache core: block hashes, block pool, per-request block tables, host
tier and KV cache events. Pure Python + numpy + xxhash, shared by the engine and the router.
"""

from kv.block_pool import Block, BlockPool, FreeBlockQueue
from kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventLog,
    KVEvent,
    ReplicaEventTracker,
    ReplicaSets,
    Snapshot,
)
from kv.hashing import BlockHash, block_hashes, hash_block, namespace_root, tokens_to_bytes
from kv.host_tier import HostTier
from kv.manager import CopyPlan, KVCacheConfig, KVCacheManager, MatchResult, PrefixCacheStats

__all__ = [
    "AllBlocksCleared", "Block", "BlockHash", "BlockPool", "BlockRemoved", "BlockStored",
    "CopyPlan", "EventBatch", "EventLog", "FreeBlockQueue", "HostTier", "KVCacheConfig",
    "KVCacheManager", "KVEvent", "MatchResult", "PrefixCacheStats", "ReplicaEventTracker",
    "ReplicaSets", "Snapshot", "block_hashes", "hash_block", "namespace_root", "tokens_to_bytes",
]
