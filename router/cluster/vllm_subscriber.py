"""One external worker's vLLM KV events, followed over ZMQ and fed to a Protocol 2 sink.

A SUB socket follows the worker's stream (worker/vllm_events/frames.py); its block hashes
are mapped to router hashes (router/core/engine_hash_map.py) and applied to the sink (the KV
index actor's `publish` / `publish_snapshot`) as one Protocol 2 replica, under an epoch of
this subscriber's own. The view is either exact ("synced": built from a known start, with
every batch since) or a subset of what the worker holds (joined mid-stream, or lost a
batch): then the worker's mode is approximate, and the router guesses for it.

    start      ask for a snapshot (kvroute's publisher answers; vLLM does not), else replay
               from seq 0: synced if the worker's replay buffer starts there
    seq = next apply; an AllBlocksCleared makes the view exact again
    seq > next a gap: replay the missing seqs; what replay cannot fill is lost: ask for a
               snapshot, else start again from empty (a subset: approximate)
    seq < next a duplicate (same payload as applied: dropped), or the worker restarted
               (different payload): start again from empty at seq 0
    silence    no message for `stale_after_s`: a replay request probes the worker (an answer
               means idle, not lost); without one the mode is approximate until a message
    malformed  counted, and handled as a lost batch; unknown event types: counted, skipped
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict

import xxhash
import zmq
import zmq.asyncio

from kv.events import EventBatch, KVEvent, Snapshot
from router.cluster.external_worker_spec import (
    APPROXIMATE,
    EVENTS,
    EventSink,
    ExternalWorkerSpec,
    SubscriberConfig,
    SubscriberStats,
)
from router.cluster.zmq_replay import request_replay
from router.core.engine_hash_map import EngineHashMap
from worker.vllm_events import frames, wire

log = logging.getLogger(__name__)


class VllmEventSubscriber:
    """Follows one worker (`run`, an asyncio task) and feeds `sink`. `mode` and `stats`
    are read by the worker set that owns it (router/cluster/external_workers.py)."""

    def __init__(self, spec: ExternalWorkerSpec, sink: EventSink,
                 config: SubscriberConfig | None = None):
        self.spec = spec
        self.config = config or SubscriberConfig()
        self.stats = SubscriberStats()
        self.map = EngineHashMap(spec.hashing)
        self._sink = sink
        self._ctx = zmq.asyncio.Context.instance()
        self._topic = spec.topic.encode()
        self.synced = False
        self.silent = False
        self._next_seq: int | None = None  # the worker's next seq; None before the first
        self._digests: OrderedDict[int, int] = OrderedDict()  # seq -> payload digest
        self._last_ts = 0.0  # the latest batch time applied
        self._epoch = ""
        self._kv_seq = 0
        self._last_heard_s = time.monotonic()

    @property
    def next_seq(self) -> int | None:
        """The worker's seq this subscriber applies next (None before its first)."""
        return self._next_seq

    @property
    def mode(self) -> str:
        """"events" while the view is exact and the worker is heard; else "approximate"."""
        return EVENTS if self.synced and not self.silent else APPROXIMATE

    async def run(self) -> None:
        """Follows the worker until cancelled."""
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        sub.connect(self.spec.endpoint)
        try:
            self._restart_view()
            await self._resync(from_seq=0)
            while True:
                wait_s = self._last_heard_s + self.config.stale_after_s - time.monotonic()
                if wait_s > 0 and await sub.poll(wait_s * 1000):
                    await self._on_message(await sub.recv_multipart())
                elif wait_s <= 0:
                    await self._on_silence()
        finally:
            sub.close(linger=0)

    # -- messages --------------------------------------------------------------------------

    async def _on_message(self, msg: list[bytes]) -> None:
        try:
            frame = frames.parse_pub_frames(msg)
        except frames.FrameError:
            self.stats.num_malformed += 1  # its seq is unknown: the next message shows a gap
            return
        if frame.topic != self._topic:
            self.stats.num_foreign += 1  # SUB matches by prefix: another stream
            return
        self._last_heard_s, self.silent = time.monotonic(), False
        await self._handle(frame.seq, frame.payload)

    async def _handle(self, seq: int, payload: bytes) -> None:
        expected = self._next_seq
        if expected is None:  # the first message, nothing replayed before it
            self.synced = seq == 0
            await self._apply_or_lose(seq, payload)
        elif seq == expected:
            await self._apply_or_lose(seq, payload)
        elif seq > expected:
            await self._fill_gap(expected, seq)
            if self._next_seq == seq:
                await self._apply_or_lose(seq, payload)
        elif self._is_restart(seq, payload):
            log.info("worker %s restarted (seq %d after %d)", self.spec.worker_id, seq,
                     expected - 1)
            self.stats.num_restarts += 1
            self._restart_view()
            if seq == 0:  # a restarted worker held nothing before its seq 0
                self.synced = True
                await self._apply_or_lose(seq, payload)
            else:
                await self._resync(from_seq=0)
                await self._handle(seq, payload)  # now a duplicate, or the first message

    def _is_restart(self, seq: int, payload: bytes) -> bool:
        """An old seq: the same batch again (replay and stream overlap), or a restarted
        worker's new batch. Its digest tells, while remembered; else its time does."""
        digest = self._digests.get(seq)
        if digest is not None:
            return digest != xxhash.xxh3_64_intdigest(payload)
        try:
            return wire.decode_batch(payload).batch.ts > self._last_ts
        except wire.WireFormatError:
            self.stats.num_malformed += 1
            return False

    async def _apply_or_lose(self, seq: int, payload: bytes) -> None:
        if not self._apply(seq, payload):
            self.stats.num_gaps_lost += 1
            await self._lose(seq + 1)

    def _apply(self, seq: int, payload: bytes) -> bool:
        """Applies batch `seq`; False when it is malformed (its effect is lost)."""
        self._next_seq = seq + 1
        try:
            decoded = wire.decode_batch(payload)
        except wire.WireFormatError as err:
            log.warning("worker %s seq %d: %s", self.spec.worker_id, seq, err)
            self.stats.num_malformed += 1
            return False
        self._digests[seq] = xxhash.xxh3_64_intdigest(payload)
        while len(self._digests) > self.config.num_remembered_batches:
            self._digests.popitem(last=False)
        self.stats.num_batches += 1
        self._apply_events(decoded)
        return True

    def _apply_events(self, decoded: wire.DecodedBatch) -> None:
        self.stats.num_unknown_events += decoded.num_unknown_events
        self._last_ts = max(self._last_ts, decoded.batch.ts)
        out: list[KVEvent] = []
        for event in decoded.batch.events:
            mapped = self.map.apply(event)
            if mapped is not None:
                out.append(mapped)
            if isinstance(event, wire.AllBlocksCleared):
                self.synced = True  # what follows a clear is known in full
        if out:
            self._emit(out)

    async def _fill_gap(self, expected: int, seq: int) -> None:
        answers = await self._replay(expected)
        for frame in answers or ():
            if frame.seq != self._next_seq or frame.seq >= seq:
                continue
            if not self._apply(frame.seq, frame.payload):
                break
        if self._next_seq == seq:
            self.stats.num_gaps_replayed += 1
            return
        log.warning("worker %s: seqs %d..%d lost", self.spec.worker_id, self._next_seq,
                    seq - 1)
        self.stats.num_gaps_lost += 1
        await self._lose(seq)

    async def _lose(self, resume_seq: int) -> None:
        """Some batch's effect is lost: a snapshot makes the view exact again; without one,
        start again from empty at `resume_seq` (a subset: approximate)."""
        if not await self._resync(from_seq=None):
            self._restart_view()
            self._next_seq = resume_seq

    async def _on_silence(self) -> None:
        self._last_heard_s = time.monotonic()  # probe again after another stale_after_s
        if self._next_seq is not None:
            answers = await self._replay(self._next_seq)
            if answers is not None:  # the worker answers: idle, not lost
                self.silent = False
                for frame in answers:
                    await self._handle(frame.seq, frame.payload)
                return
        self.silent = True

    # -- resync ----------------------------------------------------------------------------

    async def _resync(self, from_seq: int | None) -> bool:
        """A publisher snapshot, else (from_seq given) a replay from `from_seq`. True when
        the view is exact again."""
        answers = await self._replay(frames.SNAPSHOT_SEQ)
        if answers is not None and len(answers) == 1:
            try:
                decoded = wire.decode_batch(answers[0].payload)
            except wire.WireFormatError:
                self.stats.num_malformed += 1
            else:
                self.stats.num_snapshots += 1
                self._restart_view()
                self._apply_events(decoded)  # AllBlocksCleared, then every block
                self._next_seq, self.synced = answers[0].seq + 1, True
                return True
        if from_seq is None:
            return False
        answers = await self._replay(from_seq)
        if answers is None:
            return False
        if not answers:  # an empty buffer: the worker has published nothing yet
            self._next_seq, self.synced = from_seq, True
            return True
        self._next_seq, self.synced = answers[0].seq, answers[0].seq == from_seq
        for frame in answers:
            if frame.seq == self._next_seq and not self._apply(frame.seq, frame.payload):
                self._restart_view()  # a subset from the next batch on
                self._next_seq = frame.seq + 1
        return self.synced

    async def _replay(self, start_seq: int) -> list[frames.EventFrame] | None:
        if self.spec.replay_endpoint is None:
            return None
        try:
            return await request_replay(self._ctx, self.spec.replay_endpoint, start_seq,
                                        self.config.replay_timeout_s)
        except frames.FrameError:
            self.stats.num_malformed += 1
            return None

    # -- the sink --------------------------------------------------------------------------

    def _restart_view(self) -> None:
        """An empty view under a new epoch (the sink drops what it had for this worker)."""
        self.map.clear()
        self._digests.clear()
        self._next_seq = None
        self._epoch, self._kv_seq = uuid.uuid4().hex, 0
        self.synced = False
        self._sink.publish_snapshot(self._snapshot())

    def _emit(self, events: list[KVEvent]) -> None:
        batch = EventBatch(self.spec.worker_id, self._epoch, self._kv_seq, tuple(events))
        self._kv_seq = batch.next_seq
        if self._sink.publish(batch):
            self._sink.publish_snapshot(self._snapshot())

    def _snapshot(self) -> Snapshot:
        contents = self.map.contents()
        return Snapshot(self.spec.worker_id, self._epoch, self._kv_seq,
                        frozenset(contents["device"]), frozenset(contents["host"]))
