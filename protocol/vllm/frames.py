"""vLLM's ZMQ framing of KV event batches, for the live stream and the replay socket.

Live stream (PUB -> SUB), one multipart message per batch:

    [topic, seq as 8-byte big-endian, msgpack KVEventBatch]

Replay (ROUTER on the publisher, DEALER here): the subscriber sends `[b"", start_seq]`
(the empty frame is the envelope a REQ socket would add); the publisher answers with one
message per buffered batch whose seq >= start_seq, oldest first, then an end marker whose
seq is -1 (8 bytes 0xff, signed) and whose payload is empty:

    vLLM 0.33.0:  [b"", topic, seq, payload] ... [b"", b"", END_SEQ, b""]
    vLLM 0.22.1:  [b"", seq, payload]        ... [b"", END_SEQ, b""]

Both answer shapes are read here. kvroute's publisher also answers `SNAPSHOT_SEQ` (a start
seq no vLLM publisher can have, so vLLM answers it with the end marker alone) with one
batch that rebuilds its whole contents (see worker/vllm_events/publisher.py).
"""

from __future__ import annotations

from typing import NamedTuple

END_SEQ = b"\xff" * 8  # -1 as a signed 8-byte big-endian integer
SNAPSHOT_SEQ = (1 << 64) - 1  # "send me a snapshot": unsigned, the same bytes as END_SEQ


class FrameError(ValueError):
    """A multipart message that is not a KV event frame."""


class EventFrame(NamedTuple):
    topic: bytes
    seq: int
    payload: bytes


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def parse_pub_frames(frames: list[bytes]) -> EventFrame:
    """A live-stream message: [topic, seq, payload]."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise FrameError(f"expected [topic, 8-byte seq, payload], got {len(frames)} frames "
                         f"of {[len(f) for f in frames]} bytes")
    return EventFrame(frames[0], int.from_bytes(frames[1], "big"), frames[2])


def replay_request(start_seq: int) -> list[bytes]:
    """What a DEALER sends to ask for every buffered batch from `start_seq` on."""
    return [b"", seq_bytes(start_seq)]


def parse_replay_frames(frames: list[bytes]) -> EventFrame | None:
    """One replay answer as a DEALER receives it; None for the end marker."""
    if frames and frames[0] == b"":
        frames = frames[1:]
    if len(frames) == 3:
        topic, seq, payload = frames
    elif len(frames) == 2:
        topic, (seq, payload) = b"", frames
    else:
        raise FrameError(f"a replay answer has 2 or 3 frames after the envelope, got "
                         f"{len(frames)}")
    if len(seq) != 8:
        raise FrameError(f"a replay seq has 8 bytes, got {len(seq)}")
    if seq == END_SEQ:
        return None
    return EventFrame(topic, int.from_bytes(seq, "big"), payload)
