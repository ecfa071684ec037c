"""One external worker's vLLM KV events, followed over ZMQ and fed to a Protocol 2 sink.

A SUB socket follows the worker's stream (protocol/vllm/frames.py); its block hashes
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
    oversized  a batch over max_blocks_per_batch or with an event over max_event_bytes:
               counted, and handled as a lost batch (a frame over max_message_bytes never
               arrives: ZMQ drops the link, and the next batch shows a gap)
    flood      a live batch the worker's block budget cannot pay: the worker is cut off
               for flood_pause_s (view dropped: approximate; messages dropped undecoded),
               then followed again from its next batch (router/cluster/event_bounds.py)
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict

import xxhash
import zmq
import zmq.asyncio

from kv.events import EventBatch, KVEvent, Snapshot
from protocol.vllm import frames, wire
from router.cluster.event_bounds import BlockBudget, off_loop, pieces
from router.cluster.vllm_subscriber_spec import (
    APPROXIMATE,
    EVENTS,
    EventSink,
    SubscriberConfig,
    SubscriberSpec,
    SubscriberStats,
)
from router.cluster.zmq_replay import request_replay
from router.core.engine_hash_map import EngineHashMap

log = logging.getLogger(__name__)


class _Flooding(Exception):
    """A live batch the worker's block budget cannot pay."""


class VllmEventSubscriber:
    """Follows one worker (`run`, an asyncio task) and feeds `sink`. `mode` and `stats`
    are read by the worker set that owns it (router/cluster/external_workers.py)."""

    def __init__(self, spec: SubscriberSpec, sink: EventSink,
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
        self._budget = BlockBudget(self.config.max_blocks_per_s,
                                   self.config.max_blocks_per_batch)
        self._snapshot_budget = BlockBudget(self.config.snapshot_blocks_per_s,
                                            self.config.max_snapshot_blocks)
        self._cut_off_until_s = 0.0

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
        endpoint = self.spec.endpoint
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sub.connect(endpoint)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            self._restart_view()
            await self._resync(from_seq=0)
            while True:
                wait_s = self._last_heard_s + self.config.stale_after_s - time.monotonic()
                if wait_s <= 0:
                    await self._on_silence()
                    continue
                ready = dict(await poller.poll(wait_s * 1000))
                if monitor in ready:
                    await monitor.recv_multipart()
                    # ZMQ reconnects after a lost link, but not after a frame over
                    # MAXMSGSIZE (a protocol error): connect again in both cases
                    self.stats.num_reconnects += 1
                    sub.disconnect(endpoint)
                    sub.connect(endpoint)
                if sub in ready:
                    await self._on_message(await sub.recv_multipart())
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
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
        now = self._last_heard_s = time.monotonic()
        if now < self._cut_off_until_s:
            self.stats.num_dropped_cut_off += 1
            return
        self.silent = False
        try:
            await self._handle(frame.seq, frame.payload, live=True)
        except _Flooding:
            self._cut_off(frame.seq)

    def _cut_off(self, seq: int) -> None:
        self.stats.num_floods += 1
        log.warning("worker %s floods its KV events (seq %d is over %d blocks/s): cut off "
                    "for %.1f s, routed on routed history", self.spec.worker_id, seq,
                    self.config.max_blocks_per_s, self.config.flood_pause_s)
        self._restart_view()
        self._cut_off_until_s = time.monotonic() + self.config.flood_pause_s

    async def _handle(self, seq: int, payload: bytes, live: bool = False) -> None:
        expected = self._next_seq
        if expected is None:  # the first message, nothing replayed before it
            self.synced = seq == 0
            await self._apply_or_lose(seq, payload, live)
        elif seq == expected:
            await self._apply_or_lose(seq, payload, live)
        elif seq > expected:
            await self._fill_gap(expected, seq)
            if self._next_seq == seq:
                await self._apply_or_lose(seq, payload, live)
        elif self._is_restart(seq, payload):
            log.info("worker %s restarted (seq %d after %d)", self.spec.worker_id, seq,
                     expected - 1)
            self.stats.num_restarts += 1
            self._restart_view()
            if seq == 0:  # a restarted worker held nothing before its seq 0
                self.synced = True
                await self._apply_or_lose(seq, payload, live)
            else:
                await self._resync(from_seq=0)
                await self._handle(seq, payload, live)  # now a duplicate, or the first

    def _is_restart(self, seq: int, payload: bytes) -> bool:
        """An old seq: the same batch again (replay and stream overlap), or a restarted
        worker's new batch. Its digest tells, while remembered; else its time does (read
        without decoding its events: old seqs cost nothing of the block budget)."""
        digest = self._digests.get(seq)
        if digest is not None:
            return digest != xxhash.xxh3_64_intdigest(payload)
        try:
            return wire.batch_ts(payload) > self._last_ts
        except wire.WireFormatError:
            self.stats.num_malformed += 1
            return False

    async def _decode(self, payload: bytes,
                      max_blocks: int | None = None) -> wire.DecodedBatch | None:
        """The batch, decoded off the loop when large; None (counted) when it is malformed
        or over the bounds (`max_blocks`: max_blocks_per_batch unless given)."""
        config = self.config
        max_blocks = config.max_blocks_per_batch if max_blocks is None else max_blocks
        try:
            decoded = await off_loop(len(payload), config.inline_decode_bytes,
                                     wire.decode_batch, payload, config.max_event_bytes)
        except wire.WireFormatError as err:
            log.warning("worker %s: %s", self.spec.worker_id, err)
            if isinstance(err, wire.EventTooLarge):
                self.stats.num_oversized += 1
            else:
                self.stats.num_malformed += 1
            return None
        num_blocks = wire.num_blocks(decoded.batch)
        if num_blocks > max_blocks:
            log.warning("worker %s: a batch of %d blocks, more than %d", self.spec.worker_id,
                        num_blocks, max_blocks)
            self.stats.num_oversized += 1
            return None
        return decoded

    async def _apply_or_lose(self, seq: int, payload: bytes, live: bool = False) -> None:
        if not await self._apply(seq, payload, live):
            self.stats.num_gaps_lost += 1
            await self._lose(seq + 1)

    async def _apply(self, seq: int, payload: bytes, live: bool = False) -> bool:
        """Applies batch `seq`; False when it is malformed, oversized or (replayed) over
        the block budget: its effect is lost. Raises _Flooding for a live batch over the
        budget."""
        self._next_seq = seq + 1
        await asyncio.sleep(0)  # a replay of thousands of batches lets the loop answer
        decoded = await self._decode(payload)
        if decoded is None:
            return False
        if not self._budget.take(wire.num_blocks(decoded.batch)):
            if live:
                raise _Flooding()
            self.stats.num_over_budget += 1
            return False
        self._digests[seq] = xxhash.xxh3_64_intdigest(payload)
        while len(self._digests) > self.config.num_remembered_batches:
            self._digests.popitem(last=False)
        self.stats.num_batches += 1
        await self._apply_events(decoded, len(payload))
        return True

    async def _apply_events(self, decoded: wire.DecodedBatch, num_bytes: int) -> None:
        self.stats.num_unknown_events += decoded.num_unknown_events
        self._last_ts = max(self._last_ts, decoded.batch.ts)
        out, cleared = await off_loop(num_bytes, self.config.inline_decode_bytes,
                                      self._map_events, decoded.batch.events)
        if cleared:
            self.synced = True  # what follows a clear is known in full
        if out:
            await self._emit(out)

    def _map_events(self, events: list[wire.VllmEvent]) -> tuple[list[KVEvent], bool]:
        """The router's events for `events`, and whether they clear the cache. Runs in a
        thread for a large batch: only this subscriber's task touches the map, and it
        waits for the result."""
        out: list[KVEvent] = []
        cleared = False
        for event in events:
            mapped = self.map.apply(event)
            if mapped is not None:
                out.append(mapped)
            cleared = cleared or isinstance(event, wire.AllBlocksCleared)
        return out, cleared

    async def _fill_gap(self, expected: int, seq: int) -> None:
        answers = await self._replay(expected)
        for frame in answers or ():
            if frame.seq != self._next_seq or frame.seq >= seq:
                continue
            if not await self._apply(frame.seq, frame.payload):
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
        if time.monotonic() < self._cut_off_until_s:
            return  # cut off: approximate already, and not probed
        self.silent = True

    # -- resync ----------------------------------------------------------------------------

    async def _resync(self, from_seq: int | None) -> bool:
        """A publisher snapshot, else (from_seq given) a replay from `from_seq`. True when
        the view is exact again."""
        answers = await self._replay(frames.SNAPSHOT_SEQ)
        if answers is not None and len(answers) == 1:
            payload = answers[0].payload
            decoded = await self._decode(payload, self.config.max_snapshot_blocks)
            if decoded is not None and not self._snapshot_budget.take(
                    wire.num_blocks(decoded.batch)):
                self.stats.num_over_budget += 1
            elif decoded is not None:
                self.stats.num_snapshots += 1
                self._restart_view()
                await self._apply_events(decoded, len(payload))  # a clear, then every block
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
            if frame.seq == self._next_seq and not await self._apply(frame.seq, frame.payload):
                self._restart_view()  # a subset from the next batch on
                self._next_seq = frame.seq + 1
        return self.synced

    async def _replay(self, start_seq: int) -> list[frames.EventFrame] | None:
        if self.spec.replay_endpoint is None:
            return None
        try:
            return await request_replay(self._ctx, self.spec.replay_endpoint, start_seq,
                                        self.config.replay_timeout_s,
                                        self.config.max_message_bytes,
                                        self.config.max_replay_bytes)
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

    async def _emit(self, events: list[KVEvent]) -> None:
        """To the index, in pieces of emit_piece_blocks blocks: the loop answers routers
        between pieces."""
        for i, piece in enumerate(pieces(events, self.config.emit_piece_blocks)):
            if i:
                await asyncio.sleep(0)
            batch = EventBatch(self.spec.worker_id, self._epoch, self._kv_seq, tuple(piece))
            self._kv_seq = batch.next_seq
            if self._sink.publish(batch):
                self._sink.publish_snapshot(self._snapshot())

    def _snapshot(self) -> Snapshot:
        contents = self.map.contents()
        return Snapshot(self.spec.worker_id, self._epoch, self._kv_seq,
                        frozenset(contents["device"]), frozenset(contents["host"]))
