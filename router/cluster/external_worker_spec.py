"""What the vLLM event subscriber is given and what it reports (vllm_subscriber.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kv.events import EventBatch, Snapshot
from router.core.engine_hash_map import EngineHashConfig

EVENTS, APPROXIMATE = "events", "approximate"  # a worker's mode


@dataclass(frozen=True)
class ExternalWorkerSpec:
    """Where one worker publishes, and how its blocks map to the router's."""

    worker_id: str
    endpoint: str  # its PUB socket, e.g. tcp://10.0.0.5:5557
    hashing: EngineHashConfig  # the router's model name and block size
    replay_endpoint: str | None = None  # its ROUTER replay socket
    topic: str = ""

    def __post_init__(self):
        if not self.worker_id:
            raise ValueError("ExternalWorkerSpec: worker_id must be non-empty")
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"ExternalWorkerSpec {self.worker_id}: {name} must be a zmq "
                                 f"address (tcp://host:port), got {value!r}")


@dataclass(frozen=True)
class SubscriberConfig:
    stale_after_s: float = 5.0  # silence this long: probe, then approximate
    replay_timeout_s: float = 2.0  # for a whole replay answer
    num_remembered_batches: int = 4096  # payload digests, to tell duplicates from restarts

    def __post_init__(self):
        if not (self.stale_after_s > 0 and self.replay_timeout_s > 0):
            raise ValueError("SubscriberConfig: stale_after_s and replay_timeout_s must be > 0")
        if self.num_remembered_batches < 1:
            raise ValueError("SubscriberConfig: num_remembered_batches must be >= 1")


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
