"""The frames recorded from vLLM's own classes (fixtures/README.md)."""

import hashlib
import json
from pathlib import Path

from protocol.vllm.frames import parse_pub_frames
from protocol.vllm.wire import KVEventBatch, decode_batch

FIXTURES = Path(__file__).parent / "fixtures"
VERSIONS = ("0.33.0", "0.22.1")


def load(version: str) -> dict[str, list[list[bytes]]]:
    """The recorded messages: "pub", "replay_from_0", "replay_from_3"."""
    raw = json.loads((FIXTURES / f"vllm-{version}.json").read_text())
    assert raw["vllm_version"] == version

    def unhex(frames):
        return [[bytes.fromhex(f) for f in msg] for msg in frames]

    return {key: unhex(raw[key]) for key in ("pub", "replay_from_0", "replay_from_3")}


def recorded_batches(version: str = "0.33.0") -> list[KVEventBatch]:
    return [decode_batch(parse_pub_frames(f).payload).batch for f in load(version)["pub"]]


def h(i: int) -> bytes:
    """The recording's opaque block hash number i."""
    return hashlib.sha256(b"block-%d" % i).digest()
