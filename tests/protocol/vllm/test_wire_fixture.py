"""Decode KV event frames recorded from vLLM's own classes (fixtures/README.md)."""

import msgspec
import pytest

from protocol.vllm.frames import (
    FrameError,
    parse_pub_frames,
    parse_replay_frames,
    replay_request,
)
from protocol.vllm.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    WireFormatError,
    decode_batch,
    encode_batch,
)
from tests.protocol.vllm.recorded import VERSIONS, h, load


def stored(hashes, parent, token_ids, **kw) -> BlockStored:
    fields = dict(block_hashes=hashes, parent_block_hash=parent, token_ids=token_ids,
                  block_size=16, lora_id=None, medium="GPU", lora_name=None)
    fields.update(kw)
    return BlockStored(**fields)


EXPECTED = [
    [stored([h(0), h(1)], None, list(range(1, 33)), extra_keys=[None, None], group_idx=0,
            kv_cache_spec_kind="full_attention"),
     stored([h(2)], h(1), list(range(33, 49)), group_idx=0)],
    [stored([h(10)], None, list(range(1, 17)), lora_id=1, lora_name="sql-lora",
            extra_keys=[("sql-lora",)]),
     stored([h(20)], None, list(range(1, 17)), extra_keys=[("tenant-a",)])],
    [stored([h(2)], h(1), list(range(33, 49)), medium="CPU"),
     BlockRemoved(block_hashes=[h(2)], medium="GPU")],
    [stored([7, 8], None, list(range(100, 132)), medium=None),
     BlockRemoved(block_hashes=[h(0), h(1)], medium="GPU")],
    [AllBlocksCleared()],
]


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_batches_decode_exactly(version):
    pub = load(version)["pub"]
    assert len(pub) == len(EXPECTED)
    for seq, (frames, events) in enumerate(zip(pub, EXPECTED)):
        frame = parse_pub_frames(frames)
        assert (frame.topic, frame.seq) == (b"kv-events", seq)
        decoded = decode_batch(frame.payload)
        assert decoded.num_unknown_events == 0
        assert decoded.batch == KVEventBatch(1700000000.0 + seq, events, 0)


def test_decoded_fields_by_name():
    """The same content, read field by field (not only through struct equality)."""
    first = decode_batch(parse_pub_frames(load("0.33.0")["pub"][0]).payload).batch
    ev = first.events[0]
    assert ev.block_hashes[0].hex() == (
        "b8c6f33f1780d30977c5e964f62e7959102a3694f1c28ae0834ab12f98a3dcb0")
    assert ev.token_ids == list(range(1, 33)) and ev.block_size == 16
    assert (ev.parent_block_hash, ev.medium, ev.lora_id, ev.lora_name) == (
        None, "GPU", None, None)
    assert first.events[1].parent_block_hash == ev.block_hashes[1]
    lora = decode_batch(parse_pub_frames(load("0.22.1")["pub"][1]).payload).batch.events[0]
    assert (lora.lora_id, lora.lora_name, lora.extra_keys) == (1, "sql-lora", [("sql-lora",)])


def test_our_encoder_writes_vllm_0_33_bytes():
    for frames in load("0.33.0")["pub"]:
        payload = parse_pub_frames(frames).payload
        assert encode_batch(decode_batch(payload).batch) == payload


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_replay_answers(version):
    fixture = load(version)
    payloads = [parse_pub_frames(f).payload for f in fixture["pub"]]
    for key, start in (("replay_from_0", 0), ("replay_from_3", 3)):
        answers = [parse_replay_frames(msg) for msg in fixture[key]]
        assert answers[-1] is None  # the end marker
        assert [(a.seq, a.payload) for a in answers[:-1]] == [
            (seq, payloads[seq]) for seq in range(start, len(payloads))]
        topics = {a.topic for a in answers[:-1]}
        assert topics == ({b"kv-events"} if version == "0.33.0" else {b""})
    assert replay_request(3) == [b"", b"\x00" * 7 + b"\x03"]


def test_an_unknown_event_type_is_skipped_and_counted():
    future = msgspec.msgpack.encode({"type": "BlockPromoted", "block_hashes": [1]})
    legacy = msgspec.msgpack.encode(["BlockPromoted", [1]])
    known = msgspec.msgpack.encode(BlockRemoved(block_hashes=[5], medium="GPU"))
    payload = msgspec.msgpack.encode(
        [2.5, [msgspec.Raw(future), msgspec.Raw(known), msgspec.Raw(legacy)]])
    decoded = decode_batch(payload)
    assert decoded.num_unknown_events == 2
    assert decoded.batch == KVEventBatch(2.5, [BlockRemoved(block_hashes=[5], medium="GPU")])


@pytest.mark.parametrize("payload", [
    b"",
    b"\x93\xcb\x41",  # truncated
    msgspec.msgpack.encode({"ts": 1.0}),  # not array-like
    msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "medium": "GPU"}]]),  # no hashes
    msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, "tokens", 16]]]),  # bad field
    msgspec.msgpack.encode([1.0, [7]]),  # an event that is neither map nor array
])
def test_malformed_payloads_raise_wire_format_error(payload):
    with pytest.raises(WireFormatError):
        decode_batch(payload)


@pytest.mark.parametrize("frames", [[b"t", b"\x00" * 7], [b"t", b"\x00" * 4, b"p"]])
def test_malformed_frames(frames):
    with pytest.raises(FrameError):
        parse_pub_frames(frames)
    with pytest.raises(FrameError):
        parse_replay_frames([b""] + frames[:1])
