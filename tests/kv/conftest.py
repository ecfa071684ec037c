from kv.events import EventLog
from kv.hashing import block_hashes, namespace_root
from kv.manager import KVCacheConfig, KVCacheManager

BLOCK_SIZE = 4
ROOT = namespace_root("m")


def hashes(tokens, root=ROOT):
    return block_hashes(tokens, BLOCK_SIZE, root)


def make_manager(num_blocks=8, **kw) -> KVCacheManager:
    cfg = KVCacheConfig(num_blocks=num_blocks, block_size=BLOCK_SIZE, **kw)
    return KVCacheManager(cfg, EventLog("r0", epoch="e0"))


def admit(mgr, request_id, tokens, num_tokens=None, root=ROOT):
    """match + allocate, as the scheduler does; returns (block ids, match)."""
    h = hashes(tokens, root)
    m = mgr.match(h)
    ids = mgr.allocate(request_id, len(tokens) if num_tokens is None else num_tokens, h, m)
    return ids, m
