"""A stand-in for a vLLM worker's KV event publisher, for subscriber tests.

It speaks vLLM 0.33.0's protocol (protocol/vllm/frames.py; or 0.22.1's replay answers,
which lack the topic) over real ZMQ sockets from its own thread: PUB (an XPUB, so a test
can wait for the subscriber to listen), and a ROUTER replay socket over the last
`buffer_steps` batches. Like vLLM it has no snapshot: asked for SNAPSHOT_SEQ it answers the
end marker alone, unless a test sets `snapshot_events` (then it answers as kvroute's
publisher does: one batch of those events at the last seq). A test chooses which batches
the live stream drops (they stay in the replay buffer) and may publish raw bytes.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque

import zmq

from protocol.vllm import frames, wire


class MockVllmWorker:
    def __init__(self, topic: str = "", buffer_steps: int = 100, replay: bool = True,
                 endpoint: str = "tcp://127.0.0.1:0",
                 replay_endpoint: str = "tcp://127.0.0.1:0", replay_shape: str = "0.33.0"):
        ctx = zmq.Context.instance()
        self._pub = ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscribe, a reconnect's too
        self._pub.bind(endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay = None
        self.replay_endpoint = None
        if replay:
            self._replay = ctx.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._topic = topic.encode()
        self._replay_shape = replay_shape  # "0.33.0": topic in each answer; "0.22.1": none
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._subscribed = threading.Event()
        self._stop = threading.Event()
        self.answer_replays = True  # False: a hung worker that never answers
        self.snapshot_events: list | None = None  # set: answers snapshots, as kvroute's
        self.next_seq = 0
        self.num_replays = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def publish(self, events: list, drop: bool = False, payload: bytes | None = None,
                ts: float | None = None) -> int:
        """Queues the next batch (or raw `payload`); `drop`: kept for replay, not sent."""
        if payload is None:
            batch = wire.KVEventBatch(time.time() if ts is None else ts, events, 0)
            payload = wire.encode_batch(batch)
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        done = threading.Event()
        self._queue.put((seq, payload, drop, done))
        assert done.wait(10), "the mock worker thread is stuck"
        return seq

    def send_raw(self, msg: list[bytes]) -> None:
        """A multipart message on the live stream, outside the seq order."""
        done = threading.Event()
        self._queue.put((None, msg, False, done))
        assert done.wait(10)

    def wait_subscribed(self, timeout_s: float = 10.0) -> bool:
        return self._subscribed.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pub, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(10))
                if self._pub in ready:
                    if self._pub.recv().startswith(b"\x01"):
                        self._subscribed.set()
                if self._replay is not None and self._replay in ready:
                    self._serve_replay(self._replay.recv_multipart())
                while True:
                    try:
                        seq, payload, drop, done = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if seq is None:
                        self._pub.send_multipart(payload)
                    else:
                        self._buffer.append((seq, payload))
                        if not drop:
                            self._pub.send_multipart([self._topic, frames.seq_bytes(seq),
                                                      payload])
                    done.set()
        finally:
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)

    def _serve_replay(self, msg: list[bytes]) -> None:
        self.num_replays += 1
        if not self.answer_replays:
            return
        client, _, start = msg
        start_seq = int.from_bytes(start, "big")
        topic = [self._topic] if self._replay_shape == "0.33.0" else []
        if start_seq == frames.SNAPSHOT_SEQ and self.snapshot_events is not None:
            payload = wire.encode_batch(wire.KVEventBatch(time.time(), self.snapshot_events, 0))
            self._replay.send_multipart([client, b"", *topic,
                                         frames.seq_bytes(self.next_seq - 1), payload])
            self._buffer.clear()  # (the snapshot covers them)
        for seq, payload in self._buffer:
            if seq >= start_seq:
                self._replay.send_multipart([client, b"", *topic, frames.seq_bytes(seq),
                                             payload])
        self._replay.send_multipart([client, b"", *[b""][:len(topic)], frames.END_SEQ, b""])
