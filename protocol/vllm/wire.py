"""vLLM's KV event payloads: KVEventBatch of BlockStored / BlockRemoved / AllBlocksCleared.

The structs follow vllm/distributed/kv_events.py of vLLM 0.33.0 field for field, so that
`encode_batch` writes the bytes vLLM's own publisher writes (tests/protocol/vllm pins
this against bytes recorded from vLLM's classes). The batch is a msgspec array-like struct
`[ts, events, data_parallel_rank]`. Each event is a msgspec tagged union:

- vLLM >= 0.23 (vllm-project/vllm#42892) encodes an event as a map with its class name
  under "type": `{"type": "BlockStored", "block_hashes": [...], ...}`.
- Earlier versions encode it as an array with the tag first:
  `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, ...]`.

`decode_batch` reads both (events of both shapes may even share a batch), so kvroute
consumes vLLM 0.9 to 0.33 workers; `encode_batch` writes the current (map) shape only.

A block hash is opaque: bytes (vLLM's default sha256 hashes) or a 64-bit int
(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

ExternalBlockHash = bytes | int

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the three events; the tag is the class name, under "type"."""


class BlockStored(KVCacheEvent):
    """Full blocks stored, in order: `token_ids` holds `block_size` tokens per hash, and
    `parent_block_hash` is the hash of the block before the first (None: a root block)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None  # deprecated in vLLM in favour of lora_name
    medium: str | None  # "GPU" (None in old versions), "CPU", "STORAGE"
    lora_name: str | None
    # One entry per block: the LoRA name (when lora_name is set), multimodal
    # (identifier, offset) pairs, the cache salt, prompt-embedding digests.
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None  # KV cache group (hybrid models have several)
    kv_cache_spec_kind: str | None = None  # "full_attention", "sliding_window", ...
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


VllmEvent = BlockStored | BlockRemoved | AllBlocksCleared
EVENT_TYPES = {cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared)}


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float  # wall-clock seconds when the batch was made
    events: list[VllmEvent]
    data_parallel_rank: int | None = None


# -- the array-shaped events of vLLM < 0.23 (decode only) ----------------------------------
# Fields after block_size have defaults so that every version from 0.9 on decodes; msgspec
# ignores trailing fields a newer version appended.


class _ArrayBlockStored(msgspec.Struct, array_like=True, tag="BlockStored", gc=False):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _ArrayBlockRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved", gc=False):
    block_hashes: list[ExternalBlockHash]
    medium: str | None = None
    group_idx: int | None = None


class _ArrayAllBlocksCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared",
                             gc=False):
    pass


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class WireFormatError(ValueError):
    """A payload that is not a KVEventBatch (truncated, wrong types, a known event with
    bad fields)."""


class EventTooLarge(WireFormatError):
    """An event longer than the decoder was told to accept."""


class DecodedBatch(NamedTuple):
    batch: KVEventBatch  # the events kvroute knows, in order
    num_unknown_events: int  # events of a type this version does not know, skipped


_batch_decoder = msgspec.msgpack.Decoder(_RawBatch)
_map_decoder = msgspec.msgpack.Decoder(VllmEvent)
_array_decoder = msgspec.msgpack.Decoder(
    _ArrayBlockStored | _ArrayBlockRemoved | _ArrayAllBlocksCleared)
_any_decoder = msgspec.msgpack.Decoder()
_FROM_ARRAY = {_ArrayBlockStored: BlockStored, _ArrayBlockRemoved: BlockRemoved,
               _ArrayAllBlocksCleared: AllBlocksCleared}


def _is_msgpack_map(first_byte: int) -> bool:
    return 0x80 <= first_byte <= 0x8F or first_byte in (0xDE, 0xDF)


def _is_msgpack_array(first_byte: int) -> bool:
    return 0x90 <= first_byte <= 0x9F or first_byte in (0xDC, 0xDD)


def _event_tag(raw: bytes) -> object:
    """The tag of an event that did not decode, or None when there is none to read."""
    try:
        value = _any_decoder.decode(raw)
    except msgspec.DecodeError:
        return None
    if isinstance(value, dict):
        return value.get("type")
    if isinstance(value, list) and value:
        return value[0]
    return None


def _decode_event(raw: bytes) -> VllmEvent | None:
    """One event of either shape; None for an event type kvroute does not know."""
    first = raw[0] if raw else -1
    try:
        if _is_msgpack_map(first):
            return _map_decoder.decode(raw)
        if _is_msgpack_array(first):
            legacy = _array_decoder.decode(raw)
            return _FROM_ARRAY[type(legacy)](**msgspec.structs.asdict(legacy))
    except msgspec.ValidationError as err:
        tag = _event_tag(raw)
        if isinstance(tag, str) and tag not in EVENT_TYPES:
            return None
        raise WireFormatError(f"bad {tag or 'untagged'} event: {err}") from err
    raise WireFormatError(f"an event must be a msgpack map or array, got byte {first:#x}")


def decode_batch(payload: bytes, max_event_bytes: int | None = None) -> DecodedBatch:
    """Decodes a KVEventBatch payload. With `max_event_bytes`, an event longer than that is
    refused before it is decoded: one event is one decoder call, which holds the GIL for
    its whole length (a 4 MiB event of 200,000 blocks: ~0.15 s).

    Raises WireFormatError when the payload is not a batch, a known event in it is
    malformed, or an event is too long; events of unknown types are skipped and counted.
    """
    try:
        raw = _batch_decoder.decode(payload)
    except msgspec.DecodeError as err:  # ValidationError is a DecodeError
        raise WireFormatError(f"not a KVEventBatch: {err}") from err
    events: list[VllmEvent] = []
    num_unknown = 0
    for raw_event in raw.events:
        if max_event_bytes is not None and len(raw_event) > max_event_bytes:
            raise EventTooLarge(f"an event of {len(raw_event)} bytes, more than "
                                  f"{max_event_bytes}")
        try:
            event = _decode_event(bytes(raw_event))
        except msgspec.DecodeError as err:
            raise WireFormatError(f"not a KV event: {err}") from err
        if event is None:
            num_unknown += 1
        else:
            events.append(event)
    return DecodedBatch(KVEventBatch(raw.ts, events, raw.data_parallel_rank), num_unknown)


def batch_ts(payload: bytes) -> float:
    """A batch's time, its events left undecoded (cheap whatever their size).

    Raises WireFormatError when the payload is not a batch.
    """
    try:
        return _batch_decoder.decode(payload).ts
    except msgspec.DecodeError as err:
        raise WireFormatError(f"not a KVEventBatch: {err}") from err


def num_blocks(batch: KVEventBatch) -> int:
    """The blocks a batch stores or removes (what applying it costs)."""
    return sum(len(e.block_hashes) for e in batch.events
               if isinstance(e, (BlockStored, BlockRemoved)))


def encode_batch(batch: KVEventBatch, encoder: msgspec.msgpack.Encoder | None = None) -> bytes:
    """The payload vLLM 0.33.0's publisher would send for `batch`."""
    return (encoder or _encoder).encode(batch)


_encoder = msgspec.msgpack.Encoder()
