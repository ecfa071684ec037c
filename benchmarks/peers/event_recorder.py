"""The workers' KV events as the client hears them, to classify live misses afterwards.

One thread follows every worker's ZMQ stream (vLLM's wire format), maps each stored or
removed block to router hashes through its token ids (router/core/engine_hash_map.py, as
kvroute's subscriber does) and logs `(perf_counter time, worker, stored?, hashes)`. It
starts before the workers serve anything of the run, so it misses no block.
`live_miss_classes` then replays that log beside the requests (times on the same clock):

    never_seen          no earlier prompt had the block
    evicted_everywhere  an earlier prompt had it; no worker held it when the request was sent
    not_yet_published   no worker's events showed it at send time, but it was computed (a
                        worker other than the serving one stored it after the request was
                        sent and before its first token): in flight
    elsewhere           another worker held it at send time (by its events), the serving one
                        did not
    here_gone           the serving worker held it at send time (by its events), but not
                        when it ran

The serving worker is the one that stored the request's first uncached block first after
it was sent (the prefill it ran). Counted in tokens over all prompt tokens.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence

import zmq

from benchmarks.peers.measure import prompt_token_ids
from kv.hashing import DEFAULT_BLOCK_SIZE, block_hashes, namespace_root
from protocol.vllm import frames, wire
from router.core.engine_hash_map import EngineHashConfig, EngineHashMap

CLASSES = ("never_seen", "evicted_everywhere", "not_yet_published", "elsewhere", "here_gone")


class EventRecorder:
    def __init__(self, endpoints: Sequence[str], model: str,
                 block_size: int = DEFAULT_BLOCK_SIZE):
        self.log: list[tuple[float, int, bool, tuple]] = []
        self._maps = [EngineHashMap(EngineHashConfig(model=model, router_block_size=block_size))
                      for _ in endpoints]
        self._ctx = zmq.Context()
        self._socks = []
        for ep in endpoints:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(ep)
            self._socks.append(sock)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        for s in self._socks:
            poller.register(s, zmq.POLLIN)
        index = {s: i for i, s in enumerate(self._socks)}
        while not self._stop.is_set():
            for sock, _ in poller.poll(100):
                msg = sock.recv_multipart()
                now = time.perf_counter()
                batch = wire.decode_batch(frames.parse_pub_frames(msg).payload).batch
                i = index[sock]
                for ev in batch.events:
                    mapped = self._maps[i].apply(ev)
                    if mapped is None or not hasattr(mapped, "block_hashes"):
                        continue
                    if getattr(mapped, "medium", "device") != "device":
                        continue
                    stored = type(mapped).__name__ == "BlockStored"
                    self.log.append((now, i, stored, tuple(mapped.block_hashes)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for s in self._socks:
            s.close(linger=0)
        self._ctx.term()


def _requests(records: Sequence, t0: float, model: str, block_size: int) -> list[tuple]:
    """(sent, first token, record, prompt hashes) per record, by send time (perf_counter)."""
    root = namespace_root(model)
    reqs = []
    for r in records:
        ids = prompt_token_ids(r.prompt)
        reqs.append((t0 + r.sent_s, t0 + (r.first_chunk_s or r.sent_s), r,
                     block_hashes(ids, block_size, root)))
    reqs.sort(key=lambda x: x[0])
    return reqs


def _stores(log: Sequence[tuple]) -> dict[bytes, list[tuple[float, int]]]:
    """Each hash's stores: (time, worker), in log order."""
    stores: dict[bytes, list[tuple[float, int]]] = {}
    for t, w, stored, hashes in log:
        if stored:
            for h in hashes:
                stores.setdefault(h, []).append((t, w))
    return stores


def _first_miss(rec, hashes: Sequence[bytes], block_size: int) -> int:
    """The index of the request's first uncached block (len(hashes): it hit them all)."""
    if rec.cached_tokens >= rec.prompt_tokens - 1:  # all it could hit ("last token")
        return len(hashes)
    return rec.cached_tokens // block_size


def _serving(stores: dict, hashes: Sequence[bytes], hit: int, sent: float) -> int | None:
    """The worker that stored the first uncached block first after the send (its prefill);
    None when every block was a hit or no store followed."""
    if hit >= len(hashes):
        return None
    later = [(t, w) for t, w in stores.get(hashes[hit], ()) if t >= sent]
    return min(later)[1] if later else None


def serving_workers(records: Sequence, log: Sequence[tuple], t0: float, model: str,
                    block_size: int = DEFAULT_BLOCK_SIZE) -> dict[str, int | None]:
    """Request id -> the index of the worker that ran its prefill (None: unknown, e.g. a
    request whose prompt was all cached)."""
    stores = _stores(log)
    return {rec.request_id: _serving(stores, hashes, _first_miss(rec, hashes, block_size),
                                     sent)
            for sent, _, rec, hashes in _requests(records, t0, model, block_size)}


def live_miss_classes(records: Sequence, log: Sequence[tuple], t0: float, model: str,
                      num_workers: int, block_size: int = DEFAULT_BLOCK_SIZE) -> dict[str, float]:
    """`records`: the run's HttpRecords (times since `t0`, a perf_counter time)."""
    reqs = _requests(records, t0, model, block_size)
    stores = _stores(log)  # first time each worker stored each hash after a time
    held: list[set] = [set() for _ in range(num_workers)]
    seen: set = set()
    counts: Counter = Counter()
    total = 0
    j = 0
    for sent, ran, rec, hashes in reqs:
        while j < len(log) and log[j][0] <= sent:
            _, w, stored, hs = log[j]
            (held[w].update if stored else held[w].difference_update)(hs)
            j += 1
        total += rec.prompt_tokens
        hit = _first_miss(rec, hashes, block_size)
        serving = _serving(stores, hashes, hit, sent)
        for i in range(hit, len(hashes)):
            h = hashes[i]
            if h not in seen:
                cls = "never_seen"
            elif serving is not None and h in held[serving]:
                cls = "here_gone"
            elif any(h in held[w] for w in range(num_workers)):
                cls = "elsewhere"
            elif any(sent <= t < ran and w != serving for t, w in stores.get(h, ())):
                # another worker stored it after the request was sent: one in flight there
                # computed it (the serving worker's store is this request's own prefill; a
                # store before the send, held nowhere at send time, was evicted since)
                cls = "not_yet_published"
            else:
                cls = "evicted_everywhere"
            counts[cls] += block_size
        seen.update(hashes)
    return {c: counts[c] / total if total else 0.0 for c in CLASSES}
