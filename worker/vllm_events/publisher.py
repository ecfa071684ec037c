"""One kvroute engine's KV events published in vLLM's format, as `vllm serve` publishes them.

ZMQ PUB sends `[topic, seq, payload]` per batch (protocol/vllm/frames.py); a ROUTER
replay socket answers "everything from seq N" from the last `buffer_steps` batches, so any
vLLM KV event consumer (and kvroute's own subscriber) can follow a kvroute engine. Two
additions, both invisible to consumers that do not use them:

- a heartbeat: an empty batch when nothing was sent for `heartbeat_s` (seq 0 is one, sent
  at start), so a subscriber can tell an idle engine from a lost one;
- a snapshot on the replay socket: asked for seq `SNAPSHOT_SEQ`, the publisher answers with
  one batch, AllBlocksCleared then every block it holds, valid after the seq it carries.

One thread owns the sockets, the translator and the replay buffer, so a snapshot is always
consistent with the seq it is sent with. The engine side calls, every publish interval:

    engine.core.event_log.with_token_ids = True  # once, before the first request
    publisher = VllmEventPublisher(VllmPublisherConfig(...), model, engine.config.block_size)
    publisher.publish_from(engine)          # drains the log; a snapshot after a gap
    publisher.close()                       # at shutdown
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import msgspec
import zmq

from kv.events import EventBatch, KVEvent, Snapshot
from protocol.vllm import frames, wire
from worker.vllm_events.translate import Namespace, VllmEventTranslator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VllmPublisherConfig:
    endpoint: str = "tcp://127.0.0.1:0"  # PUB bind address; port 0 picks a free port
    replay_endpoint: str | None = "tcp://127.0.0.1:0"  # ROUTER bind address; None: no replay
    topic: str = ""  # vLLM's default
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # PUB send high-water mark, in messages
    heartbeat_s: float = 1.0
    data_parallel_rank: int = 0

    def __post_init__(self):
        for name in ("buffer_steps", "hwm"):
            if getattr(self, name) < 1:
                raise ValueError(f"VllmPublisherConfig: {name} must be >= 1")
        if not self.heartbeat_s > 0:
            raise ValueError(f"VllmPublisherConfig: heartbeat_s must be > 0, got "
                             f"{self.heartbeat_s}")
        if not self.endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"VllmPublisherConfig: endpoint must be a zmq address "
                             f"(tcp://host:port, ipc://path), got {self.endpoint!r}")


class EngineEvents(Protocol):
    """What `publish_from` needs of an engine (worker.engine.engine.Engine has it)."""

    def drain_events(self) -> EventBatch: ...
    def snapshot(self) -> Snapshot: ...
    def namespaces(self) -> list[Namespace]: ...


_CLOSE = object()


class VllmEventPublisher:
    def __init__(self, config: VllmPublisherConfig, model: str, block_size: int):
        self.config = config
        self._translator = VllmEventTranslator(model, block_size)
        self._topic = config.topic.encode()
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._pub.bind(config.endpoint)
        self.endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay: zmq.Socket | None = None
        self.replay_endpoint: str | None = None
        if config.replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            # A full replay and its end marker must fit, or answers are dropped.
            self._replay.setsockopt(zmq.SNDHWM, 2 * (config.buffer_steps + 1))
            self._replay.bind(config.replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._next_seq = 0  # the next vLLM seq (publisher thread only)
        self._last_send_s = 0.0
        self.num_replays_served = 0
        self.num_snapshots_served = 0
        # caller side: where the engine's log is, to see gaps in it
        self._lock = threading.Lock()
        self._epoch: str | None = None
        self._next_kv_seq = 0
        self._closed = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._doorbell_r, self._doorbell_w = os.pipe()
        os.set_blocking(self._doorbell_w, False)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"vllm-events-{self.endpoint}")
        self._thread.start()

    @property
    def num_unpublished_blocks(self) -> int:
        """Stored blocks left out because their tokens or namespace were unknown."""
        return self._translator.num_unpublished_blocks

    # -- caller side -----------------------------------------------------------------------

    def publish(self, batch: EventBatch, namespaces: Iterable[Namespace] = ()) -> bool:
        """Queues a drained batch's events. Returns True when the batch does not follow the
        last one (a gap or a new epoch): send `publish_snapshot(engine.snapshot())` then."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the publisher is closed")
            fresh = self._epoch is None and batch.first_seq == 0
            if not fresh and (batch.epoch != self._epoch or batch.first_seq != self._next_kv_seq):
                return True
            self._epoch, self._next_kv_seq = batch.epoch, batch.next_seq
            if batch.events:
                self._put(("batch", batch.events, tuple(namespaces)))
        return False

    def publish_snapshot(self, snapshot: Snapshot) -> None:
        """Publishes the engine's contents again (AllBlocksCleared, then its blocks)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the publisher is closed")
            self._epoch, self._next_kv_seq = snapshot.epoch, snapshot.next_seq
            self._put(("snapshot", snapshot))

    def publish_from(self, engine: EngineEvents) -> None:
        """Drains the engine's log and publishes it; after a gap, its snapshot."""
        if self.publish(engine.drain_events(), engine.namespaces()):
            self.publish_snapshot(engine.snapshot())

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Waits until everything queued so far is sent; False on timeout."""
        sent = threading.Event()
        with self._lock:
            if self._closed:
                raise RuntimeError("the publisher is closed")
            self._put(("flush", sent))
        return sent.wait(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Sends what was queued, then closes the sockets."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._put(_CLOSE)
        self._thread.join(timeout_s)
        os.close(self._doorbell_w)

    def _put(self, item: object) -> None:
        self._queue.put(item)
        try:
            os.write(self._doorbell_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of rings already: the thread is awake

    # -- publisher thread ------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._doorbell_r, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        self._send([])  # seq 0: the stream has started
        try:
            while True:
                wait_s = self._last_send_s + self.config.heartbeat_s - time.monotonic()
                ready = dict(poller.poll(max(0, math.ceil(wait_s * 1000))))
                if self._doorbell_r in ready:
                    os.read(self._doorbell_r, 4096)
                if not self._drain_queue():
                    return
                if self._replay is not None and self._replay in ready:
                    while self._replay.poll(0):
                        self._serve_replay(self._replay.recv_multipart())
                if time.monotonic() - self._last_send_s >= self.config.heartbeat_s:
                    self._send([])
        except Exception:
            log.exception("the vLLM event publisher thread failed")
        finally:
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)
            os.close(self._doorbell_r)

    def _drain_queue(self) -> bool:
        """Publishes everything queued; False once the close marker is reached."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is _CLOSE:
                return False
            if item[0] == "flush":
                item[1].set()
                continue
            try:
                if item[0] == "batch":
                    events: tuple[KVEvent, ...] = item[1]
                    vllm_events = self._translator.translate(events, item[2])
                else:
                    vllm_events = self._translator.reset(item[1])
            except ValueError:  # a store whose tokens do not fit its blocks: an engine bug
                log.exception("a KV event batch could not be translated; republishing all")
                vllm_events = self._translator.snapshot_events()
            if vllm_events:
                self._send(vllm_events)

    def _batch(self, events: list[wire.VllmEvent]) -> bytes:
        return wire.encode_batch(wire.KVEventBatch(time.time(), events,
                                                   self.config.data_parallel_rank),
                                 self._encoder)

    def _send(self, events: list[wire.VllmEvent]) -> None:
        seq, payload = self._next_seq, self._batch(events)
        self._pub.send_multipart([self._topic, frames.seq_bytes(seq), payload])
        self._buffer.append((seq, payload))
        self._next_seq += 1
        self._last_send_s = time.monotonic()

    def _serve_replay(self, msg: list[bytes]) -> None:
        if len(msg) != 3 or len(msg[2]) != 8:
            log.warning("ignored a replay request of %d frames", len(msg))
            return
        client, start_seq = msg[0], int.from_bytes(msg[2], "big")
        assert self._replay is not None
        if start_seq == frames.SNAPSHOT_SEQ:
            payload = self._batch(self._translator.snapshot_events())
            self._replay.send_multipart([client, b"", self._topic,
                                         frames.seq_bytes(self._next_seq - 1), payload])
            self.num_snapshots_served += 1
        else:
            for seq, payload in self._buffer:
                if seq >= start_seq:
                    self._replay.send_multipart([client, b"", self._topic,
                                                 frames.seq_bytes(seq), payload])
            self.num_replays_served += 1
        self._replay.send_multipart([client, b"", b"", frames.END_SEQ, b""])
