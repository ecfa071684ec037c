"""Protocol 1: chained xxh3-128 block hashes over token ids.

The router and the engine must agree bit for bit, so this module is the only place that
turns token ids into block hashes. A hash is the 16-byte canonical xxh3_128 digest.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Sequence

import numpy as np
import xxhash

BlockHash = bytes  # 16-byte xxh3_128 digest

# Tokens per block unless configured: the router and the engines must use the same value,
# and every default in the project is this one.
DEFAULT_BLOCK_SIZE = 16

_NAMESPACE_TAG = b"kvroute/1\x00"
_UINT32_LE = np.dtype("<u4")
_xxh3_128_digest = xxhash.xxh3_128_digest


def namespace_root(model: str, adapter: str = "", salt: str = "") -> BlockHash:
    """The parent of block 0: model, LoRA adapter and tenant salt are part of every hash.

    The fields are joined with NUL; a field holding NUL or backslash is escaped first, so
    ("a\\x00b", "") and ("a", "b") cannot alias (fields without them hash as before).
    """
    payload = b"\x00".join(_escape_field(field) for field in (model, adapter, salt))
    return _xxh3_128_digest(_NAMESPACE_TAG + payload)


def _escape_field(field: str) -> bytes:
    if "\x00" in field or "\\" in field:
        field = field.replace("\\", "\\\\").replace("\x00", "\\0")
    return field.encode("utf-8")


_NATIVE_LE_UINT32 = array.array("I").itemsize == 4 and sys.byteorder == "little"


def tokens_to_bytes(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """Token ids as uint32 little-endian bytes (ids must fit in 32 bits).

    A Python list goes through `array.array` (faster than numpy's conversion of a list);
    an ndarray is cast in place.
    """
    if isinstance(token_ids, np.ndarray):
        return token_ids.astype(_UINT32_LE, copy=False).tobytes()
    if _NATIVE_LE_UINT32:
        return array.array("I", token_ids).tobytes()
    return np.asarray(token_ids, dtype=np.int64).astype(_UINT32_LE).tobytes()


def block_hashes(
    token_ids: Sequence[int] | np.ndarray,
    block_size: int,
    root: BlockHash,
    start_block: int = 0,
    parent_hash: BlockHash | None = None,
) -> list[BlockHash]:
    """Hashes of the full blocks of `token_ids`, from block `start_block` on.

    Args:
        token_ids: the whole token sequence (a trailing partial block gets no hash).
        block_size: tokens per block.
        root: namespace root (see `namespace_root`).
        start_block: first block to hash; pass the previous block's hash as `parent_hash`
            to extend an existing chain without rehashing it.
        parent_hash: hash of block `start_block - 1`; ignored when start_block == 0.

    Returns:
        One 16-byte digest per full block, in order.
    """
    num_full_blocks = len(token_ids) // block_size
    if start_block >= num_full_blocks:
        return []
    if start_block > 0 and parent_hash is None:
        raise ValueError("parent_hash is required when start_block > 0")
    block_bytes = block_size * 4
    if start_block == 0:
        data = tokens_to_bytes(token_ids)  # whole: cheaper than slicing the list first
        full = memoryview(data)[: num_full_blocks * block_bytes]
        prev = root
    else:
        # Extending a chain (a decode step filled a block): convert only the new blocks, so
        # the cost is O(new tokens), not O(sequence).
        full = memoryview(tokens_to_bytes(
            token_ids[start_block * block_size : num_full_blocks * block_size]))
        prev = parent_hash
    out: list[BlockHash] = []
    append = out.append
    digest = _xxh3_128_digest
    # struct.iter_unpack cuts the blocks in C, faster than slicing in the loop.
    for (chunk,) in struct.iter_unpack(f"{block_bytes}s", full):
        prev = digest(prev + chunk)
        append(prev)
    return out


def hash_block(parent_hash: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """Hash of one full block given its parent's hash."""
    return _xxh3_128_digest(parent_hash + tokens_to_bytes(token_ids))
