"""What the vLLM event subscriber is given and what it reports (vllm_subscriber.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kv.events import EventBatch, Snapshot
from router.core.engine_hash_map import EngineHashConfig

EVENTS, APPROXIMATE = "events", "approximate"  # a worker's mode


@dataclass(frozen=True)
class SubscriberSpec:
    """Where one worker publishes, and how its blocks map to the router's."""

    worker_id: str
    endpoint: str  # its PUB socket, e.g. tcp://10.0.0.5:5557
    hashing: EngineHashConfig  # the router's model name and block size
    replay_endpoint: str | None = None  # its ROUTER replay socket
    topic: str = ""

    def __post_init__(self):
        if not self.worker_id:
            raise ValueError("SubscriberSpec: worker_id must be non-empty")
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"SubscriberSpec {self.worker_id}: {name} must be a zmq "
                                 f"address (tcp://host:port), got {value!r}")


@dataclass(frozen=True)
class SubscriberConfig:
    """How one worker's stream is followed, and the bounds on what it may cost the index
    actor's event loop (which answers every router). A vLLM engine step publishes one
    batch of tens to a few thousand blocks; kvroute's publisher answers a snapshot with
    one batch of every block it holds."""

    stale_after_s: float = 5.0  # silence this long: probe, then approximate
    replay_timeout_s: float = 2.0  # for a whole replay answer
    num_remembered_batches: int = 4096  # payload digests, to tell duplicates from restarts
    max_message_bytes: int = 8 << 20  # one ZMQ frame (MAXMSGSIZE: larger drops the link)
    max_event_bytes: int = 1 << 20  # one event in a batch (~16,000 blocks of 16 tokens)
    max_replay_bytes: int = 64 << 20  # one whole replay answer
    max_blocks_per_batch: int = 65_536  # a live or replayed batch
    # A snapshot holds every block a worker has (a large GPU holds millions): it has a cap
    # of its own and a budget of its own, so a worker that keeps losing its stream (and
    # asking for snapshots) still costs the index a bounded rate: one whole snapshot per
    # max_snapshot_blocks / snapshot_blocks_per_s seconds (16 s by default).
    max_snapshot_blocks: int = 4_194_304
    snapshot_blocks_per_s: float = 262_144.0
    # A worker's sustained rate (blocks stored and removed per second), with bursts of
    # max_blocks_per_batch. A live batch over it cuts the worker off for flood_pause_s:
    # its view is dropped (approximate) and its messages are dropped undecoded.
    max_blocks_per_s: float = 16_384.0
    flood_pause_s: float = 5.0
    # Payloads up to this are decoded on the loop; larger ones in a thread (the loop goes
    # on answering routers meanwhile), and their events reach the index in pieces of
    # emit_piece_blocks blocks, the loop answering between pieces.
    inline_decode_bytes: int = 64 << 10
    emit_piece_blocks: int = 4096

    def __post_init__(self):
        if not (self.stale_after_s > 0 and self.replay_timeout_s > 0):
            raise ValueError("SubscriberConfig: stale_after_s and replay_timeout_s must be > 0")
        if self.num_remembered_batches < 1:
            raise ValueError("SubscriberConfig: num_remembered_batches must be >= 1")
        for name in ("max_message_bytes", "max_event_bytes", "max_replay_bytes",
                     "max_blocks_per_batch", "max_snapshot_blocks", "emit_piece_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"SubscriberConfig: {name} must be >= 1, got "
                                 f"{getattr(self, name)}")
        if not (self.max_blocks_per_s > 0 and self.flood_pause_s > 0
                and self.snapshot_blocks_per_s > 0):
            raise ValueError("SubscriberConfig: max_blocks_per_s, snapshot_blocks_per_s and "
                             "flood_pause_s must be > 0")
        if self.inline_decode_bytes < 0:
            raise ValueError("SubscriberConfig: inline_decode_bytes must be >= 0")


class EventSink(Protocol):
    """Where mapped events go (the KV index actor's methods have this shape)."""

    def publish(self, batch: EventBatch) -> bool: ...  # True: send a snapshot
    def publish_snapshot(self, snap: Snapshot) -> None: ...


@dataclass
class SubscriberStats:
    num_batches: int = 0  # applied in order
    num_malformed: int = 0  # payloads or frames that did not decode
    num_unknown_events: int = 0  # event types this version does not know
    num_foreign: int = 0  # messages on another topic
    num_gaps_replayed: int = 0
    num_gaps_lost: int = 0  # gaps replay could not fill (buffer too short, no answer)
    num_restarts: int = 0  # the worker's seq went back: it restarted
    num_snapshots: int = 0  # resyncs from a publisher snapshot
    num_reconnects: int = 0  # links to its PUB socket lost (or cut at MAXMSGSIZE) and redone
    # batches refused, by why: more blocks than max_blocks_per_batch or an event over
    # max_event_bytes (oversized); a replay or snapshot the block budget could not pay
    # (over_budget); a live batch it could not pay (floods: the worker was cut off), and
    # the messages dropped undecoded while it was (dropped_cut_off)
    num_oversized: int = 0
    num_over_budget: int = 0
    num_floods: int = 0
    num_dropped_cut_off: int = 0
