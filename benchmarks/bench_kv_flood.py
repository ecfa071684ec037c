"""How responsive the KV index stays while a hostile worker floods its KV event stream.

One process runs the KV index (the actor's class, on one event loop as in the actor) and
follows two external workers over real ZMQ sockets: an honest one publishing 2-block
batches every 20 ms, and a hostile one that publishes `--num-batches` batches of
`--num-blocks` blocks each (one BlockStored: int hashes, block size 16). A probe answers a
trivial call every 2 ms, as the actor would answer `get_incarnation` (a task on its loop):
its latency is what a router's poll waits on top of its own work.

    python benchmarks/bench_kv_flood.py                    # 3 batches of 200,000 blocks
    python benchmarks/bench_kv_flood.py --num-blocks 65536 --blocks-per-event 8192

Prints the probe's latency before and during the flood, whether the honest worker stayed
in `events` mode, the hostile worker's counters, and `uptime`; the JSON line last.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import threading
import time

import zmq

from kv.events import Cursor
from kv.hashing import DEFAULT_BLOCK_SIZE
from protocol.vllm import frames, wire
from router.cluster.index_actor import KVIndex, PollRequest
from router.cluster.vllm_subscriber_spec import EVENTS, SubscriberSpec
from router.core.engine_hash_map import EngineHashConfig

BLOCK_SIZE = DEFAULT_BLOCK_SIZE


class Publisher:
    """A PUB socket and a replay socket that answers every replay with the end marker
    (an empty buffer, as vLLM's right after it started)."""

    def __init__(self):
        ctx = zmq.Context.instance()
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.bind("tcp://127.0.0.1:0")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay = ctx.socket(zmq.ROUTER)
        self.replay.bind("tcp://127.0.0.1:0")
        self.replay_endpoint = self.replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self.subscribed = threading.Event()
        self.seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.pub, zmq.POLLIN)
        poller.register(self.replay, zmq.POLLIN)
        while not self._stop.is_set():
            with self._lock:
                ready = dict(poller.poll(5))
                if self.pub in ready and self.pub.recv().startswith(b"\x01"):
                    self.subscribed.set()
                if self.replay in ready:
                    client, *_ = self.replay.recv_multipart()
                    self.replay.send_multipart([client, b"", b"", frames.END_SEQ, b""])

    def send(self, payload: bytes) -> None:
        with self._lock:
            self.pub.send_multipart([b"", frames.seq_bytes(self.seq), payload])
            self.seq += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.pub.close(0)
        self.replay.close(0)


def stored_payload(first_hash: int, num_blocks: int, blocks_per_event: int | None = None
                   ) -> bytes:
    """One batch storing `num_blocks` new chains of one block each, in events of
    `blocks_per_event` blocks (default: one event)."""
    per_event = blocks_per_event or num_blocks
    events = [wire.BlockStored(block_hashes=list(range(h, h + n)), parent_block_hash=None,
                               token_ids=[i % 100 for i in range(n * BLOCK_SIZE)],
                               block_size=BLOCK_SIZE, lora_id=None, medium="GPU",
                               lora_name=None)
              for h, n in ((first_hash + s, min(per_event, num_blocks - s))
                           for s in range(0, num_blocks, per_event))]
    return wire.encode_batch(wire.KVEventBatch(time.time(), events, 0))


def probe(loop: asyncio.AbstractEventLoop, index: KVIndex,
          lat_s: list[tuple[float, float]], stop: threading.Event) -> None:
    """From another thread, as Ray hands an actor call to the actor's loop: one trivial
    call at a time, every 2 ms, each timed from sending to its answer."""

    async def trivial() -> str:
        return index.get_incarnation()

    while not stop.is_set():
        t0 = time.perf_counter()
        asyncio.run_coroutine_threadsafe(trivial(), loop).result()
        lat_s.append((t0, time.perf_counter() - t0))
        time.sleep(0.002)


async def honest_loop(pub: Publisher, stop: asyncio.Event) -> None:
    h = 10**9
    while not stop.is_set():
        pub.send(stored_payload(h, 2))
        h += 2
        await asyncio.sleep(0.02)


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else 0.0


async def main(args) -> dict:
    index = KVIndex()
    honest, hostile = Publisher(), Publisher()
    hashing = EngineHashConfig(model="m", router_block_size=BLOCK_SIZE)
    for wid, pub in (("honest", honest), ("hostile", hostile)):
        await index.add_external_worker(SubscriberSpec(
            wid, pub.endpoint, hashing, replay_endpoint=pub.replay_endpoint))
    for pub in (honest, hostile):
        await asyncio.to_thread(pub.subscribed.wait, 10)
    payloads = [stored_payload(1 + i * args.num_blocks, args.num_blocks,
                               args.blocks_per_event) for i in range(args.num_batches)]
    gc.collect()  # the payloads' token lists: not the index's garbage
    stop = asyncio.Event()
    probe_stop = threading.Event()
    lat: list[tuple[float, float]] = []
    prober = asyncio.create_task(asyncio.to_thread(
        probe, asyncio.get_running_loop(), index, lat, probe_stop))
    tasks = [asyncio.create_task(honest_loop(honest, stop))]
    await asyncio.sleep(1.0)  # baseline
    flood_start = time.perf_counter()
    honest_modes: list[str] = []
    for payload in payloads:
        hostile.send(payload)
    deadline = flood_start + args.watch_s
    while time.perf_counter() < deadline:
        honest_modes.append(index.external_worker_modes().get("honest", "?"))
        poll = await index.poll(PollRequest("bench", {"honest": Cursor("", 0)}))
        del poll
        await asyncio.sleep(0.05)
    stop.set()
    probe_stop.set()
    await asyncio.gather(prober, *tasks)
    status = index.external_worker_status()
    hostile_stats = status["hostile"].stats
    await index.external_workers.close()
    honest.close()
    hostile.close()
    before = [s for t, s in lat if t < flood_start]
    during = [s for t, s in lat if t >= flood_start]
    return {
        "bench": "kv_flood", "num_blocks": args.num_blocks, "num_batches": args.num_batches,
        "blocks_per_event": args.blocks_per_event or args.num_blocks,
        "payload_mib": round(len(payloads[0]) / 2**20, 2),
        "probe_p50_ms_before": round(statistics.median(before) * 1e3, 2),
        "probe_max_ms_before": round(max(before) * 1e3, 2),
        "probe_p99_ms_during": round(pct(during, 0.99) * 1e3, 2),
        "probe_max_ms_during": round(max(during) * 1e3, 2),
        "probe_max_at_s": round(max((s, t) for t, s in lat if t >= flood_start)[1]
                                - flood_start, 2),
        "honest_always_events": all(m == EVENTS for m in honest_modes),
        "hostile_batches_applied": hostile_stats.num_batches,
        "hostile_stats": {k: v for k, v in vars(hostile_stats).items() if v},
        "uptime": os.getloadavg()[0],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-blocks", type=int, default=200_000)
    parser.add_argument("--num-batches", type=int, default=3)
    parser.add_argument("--blocks-per-event", type=int, default=None)
    parser.add_argument("--watch-s", type=float, default=12.0)
    result = asyncio.run(main(parser.parse_args()))
    for key, value in result.items():
        print(f"{key}: {value}")
    print(json.dumps(result))
