"""`--kv-events-port`: the server's KV events in vLLM's wire format, on ZMQ.

The sink hands each drained batch to worker/vllm_events' publisher (PUB socket, replay
ROUTER socket, heartbeats); when the publisher sees that the batch does not follow the last
one (a batch was lost), it republishes the engine's whole contents from a snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from kv.events import EventBatch
from worker.engine.engine import Engine
from worker.vllm_events.publisher import VllmEventPublisher, VllmPublisherConfig


@dataclass(frozen=True)
class VllmEventsConfig:
    host: str
    port: int  # PUB; 0: any free port
    replay_port: int | None = None  # ROUTER; default port + 1 (any free port when port is 0)
    topic: str = ""  # vLLM's default

    def __post_init__(self):
        for name in ("port", "replay_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise ValueError(f"kv events {name} must be in [0, 65535], got {value}")
        if self.replay_port is not None and self.replay_port == self.port != 0:
            raise ValueError(f"the KV events port and its replay port are both {self.port}")

    def publisher_config(self) -> VllmPublisherConfig:
        replay_port = self.replay_port
        if replay_port is None:
            replay_port = self.port + 1 if self.port else 0
        return VllmPublisherConfig(endpoint=f"tcp://{self.host}:{self.port}",
                                   replay_endpoint=f"tcp://{self.host}:{replay_port}",
                                   topic=self.topic)


def open_publisher(config: VllmEventsConfig, model_name: str, block_size: int
                   ) -> VllmEventPublisher:
    """Binds the sockets; OSError naming them when it cannot."""
    publisher_config = config.publisher_config()
    try:
        return VllmEventPublisher(publisher_config, model_name, block_size)
    except zmq.ZMQError as err:
        raise OSError(f"cannot bind the KV event sockets {publisher_config.endpoint} and "
                      f"{publisher_config.replay_endpoint}: {err}") from None


class VllmEventSink:
    """A KVEventSink (kv_events.py) that publishes in vLLM's format. The engine's stores
    must carry their token ids, which vLLM's BlockStored sends: this turns that on."""

    def __init__(self, publisher: VllmEventPublisher, engine: Engine):
        self.publisher = publisher
        self._engine = engine
        engine.core.event_log.with_token_ids = True  # before the first request is admitted

    def publish(self, batch: EventBatch) -> None:
        if self.publisher.publish(batch, self._engine.namespaces()):
            self.publisher.publish_snapshot(self._engine.snapshot())

    def close(self) -> None:
        self.publisher.close()
