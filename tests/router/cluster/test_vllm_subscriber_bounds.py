"""A hostile worker's KV event stream (real ZMQ sockets, tests/router/cluster/
mock_vllm_worker.py) costs the index a bounded amount: oversized frames, events and batches
are refused, a flooding worker is cut off while another one is still followed, and a
large batch reaches the index in pieces with the loop running other work between them."""

import asyncio
from contextlib import asynccontextmanager

import zmq.asyncio

from protocol.vllm import wire
from router.cluster.event_bounds import BlockBudget
from router.cluster.vllm_subscriber import VllmEventSubscriber
from router.cluster.vllm_subscriber_spec import (
    APPROXIMATE,
    EVENTS,
    SubscriberConfig,
    SubscriberSpec,
)
from router.cluster.zmq_replay import request_replay
from router.core.engine_hash_map import EngineHashConfig
from tests.router.cluster.mock_vllm_worker import MockVllmWorker
from tests.router.cluster.test_event_bounds import Clock
from tests.router.cluster.test_vllm_subscriber import (
    MODEL,
    B,
    LogSink,
    router_hashes,
    started,
    stored,
    tokens,
    until,
)

BOUNDED = dict(stale_after_s=30.0, replay_timeout_s=1.0, max_blocks_per_batch=8,
               max_blocks_per_s=1e-9, flood_pause_s=3600.0)  # the budget never refills


def chain(seed: int, num_blocks: int) -> tuple[list, list[bytes]]:
    """A store of a new `num_blocks`-block chain, and its router hashes."""
    token_ids = tokens(seed, num_blocks)
    names = [f"{seed}-{i}".encode() for i in range(num_blocks)]
    return [stored(names, None, token_ids)], router_hashes(token_ids)


@asynccontextmanager
async def following(worker, worker_id: str = "w", **config):
    sink = LogSink()
    spec = SubscriberSpec(worker_id, worker.endpoint, EngineHashConfig(MODEL, B),
                              worker.replay_endpoint)
    sub = VllmEventSubscriber(spec, sink, SubscriberConfig(**{**BOUNDED, **config}))
    task = asyncio.get_running_loop().create_task(sub.run())
    try:
        yield sub, sink
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_batch_over_the_block_cap_is_refused_and_the_stream_goes_on():
    worker = MockVllmWorker()
    big, _ = chain(1, 9)
    small, small_hashes = chain(2, 2)
    async with following(worker, max_blocks_per_s=1e6) as (sub, sink):
        await started(sub, worker)
        worker.publish(big)
        worker.publish(small)
        await until(lambda: sub.next_seq == 2, what="seq 1")
        assert (sub.stats.num_oversized, sub.stats.num_batches) == (1, 1)
        assert sink.contents() == {"device": set(small_hashes), "host": set()}
    worker.close()


async def test_an_event_over_the_byte_cap_is_refused_undecoded():
    worker = MockVllmWorker()
    big, _ = chain(1, 4)
    small, small_hashes = chain(2, 1)
    async with following(worker, max_event_bytes=200, max_blocks_per_s=1e6) as (sub, sink):
        await started(sub, worker)
        worker.publish(big)  # 4 blocks of 16 tokens: over 200 bytes
        worker.publish(small)
        await until(lambda: sub.next_seq == 2, what="seq 1")
        assert (sub.stats.num_oversized, sub.stats.num_malformed) == (1, 0)
        assert sink.contents()["device"] == set(small_hashes)
    worker.close()


async def test_a_frame_over_maxmsgsize_never_arrives_and_the_gap_is_lost():
    worker = MockVllmWorker()
    big, _ = chain(1, 8)
    small, small_hashes = chain(2, 1)
    async with following(worker, max_message_bytes=400, max_blocks_per_s=1e6) as (sub, sink):
        await started(sub, worker)
        worker._subscribed.clear()
        worker.publish(big)  # ~600 bytes: ZMQ drops the link; replay refuses it too
        assert await asyncio.to_thread(worker.wait_subscribed)  # reconnected
        worker.publish(small)
        await until(lambda: sub.next_seq == 2, what="seq 1")
        assert (sub.stats.num_batches, sub.stats.num_gaps_lost) == (1, 1)
        assert sub.stats.num_reconnects >= 1
        assert sink.contents()["device"] == set(small_hashes)
        assert sub.mode == APPROXIMATE  # seq 0 is lost: a subset
    worker.close()


async def test_a_flooding_worker_is_cut_off_and_another_is_still_followed():
    flooder, honest = MockVllmWorker(), MockVllmWorker()
    first, first_hashes = chain(1, 8)
    flood, _ = chain(2, 1)
    async with following(flooder, "flooder") as (bad, bad_sink), \
            following(honest, "honest") as (good, good_sink):
        await started(bad, flooder)
        await started(good, honest)
        flooder.publish(first)  # 8 blocks: the whole budget
        await until(lambda: bad.next_seq == 1, what="the flooder's seq 0")
        assert bad_sink.contents()["device"] == set(first_hashes)
        flooder.publish(flood)  # one block more: a flood
        await until(lambda: bad.stats.num_floods == 1, what="the cut-off")
        assert bad.mode == APPROXIMATE and bad_sink.contents()["device"] == set()
        flooder.publish(flood)
        flooder.publish(flood)
        await until(lambda: bad.stats.num_dropped_cut_off == 2, what="dropped messages")
        assert bad.stats.num_batches == 1
        # the honest worker, with a budget of its own, is followed all along
        for seed in (3, 4, 5):
            events, _ = chain(seed, 2)
            honest.publish(events)
        await until(lambda: good.next_seq == 3, what="the honest worker's seq 2")
        assert good.mode == EVENTS and good.stats.num_floods == 0
        assert len(good_sink.contents()["device"]) == 6
    flooder.close()
    honest.close()


async def test_a_cut_off_worker_is_followed_again_after_the_pause():
    worker = MockVllmWorker()
    budget_clock = Clock()
    async with following(worker, max_blocks_per_s=1.0, max_blocks_per_batch=4,
                         flood_pause_s=0.05) as (sub, sink):
        sub._budget = BlockBudget(1.0, 4, clock=budget_clock)  # time stands still
        await started(sub, worker)
        events, _ = chain(1, 4)
        worker.publish(events)
        worker.publish(events)  # over the budget: cut off
        await until(lambda: sub.stats.num_floods == 1, what="the cut-off")
        budget_clock.now_s = 10.0  # the budget refills
        await asyncio.sleep(0.1)  # time itself: the 0.05 s pause ends
        after, after_hashes = chain(2, 1)
        worker.publish(after)
        await until(lambda: sub.stats.num_batches == 2, what="a batch after the pause")
        assert sink.contents()["device"] == set(after_hashes)
    worker.close()


async def test_a_large_batch_reaches_the_index_in_pieces_while_the_loop_runs():
    worker = MockVllmWorker()
    num_ticks = 0
    ticks_at_publish: list[int] = []

    async def ticker():
        nonlocal num_ticks
        while True:
            await asyncio.sleep(0)
            num_ticks += 1

    events, hashes = chain(1, 64)
    async with following(worker, max_blocks_per_batch=1000, max_blocks_per_s=1e6,
                         emit_piece_blocks=16, inline_decode_bytes=0) as (sub, sink):
        publish = sink.publish

        def counted(batch):
            ticks_at_publish.append(num_ticks)
            return publish(batch)

        sink.publish = counted
        await started(sub, worker)
        tick = asyncio.get_running_loop().create_task(ticker())
        try:
            worker.publish(events)
            # next_seq moves when a batch is taken, before its pieces are applied
            await until(lambda: len(sink.contents()["device"]) == 64, what="every piece")
        finally:
            tick.cancel()
        assert sink.contents()["device"] == set(hashes)
    assert len(ticks_at_publish) == 4  # 64 blocks in pieces of 16
    assert all(b > a for a, b in zip(ticks_at_publish, ticks_at_publish[1:]))
    worker.close()


async def test_a_replay_answer_over_its_byte_cap_is_no_answer():
    worker = MockVllmWorker()
    for seed in range(4):
        events, _ = chain(seed, 2)
        worker.publish(events)
    ctx = zmq.asyncio.Context.instance()
    whole = await request_replay(ctx, worker.replay_endpoint, 0, 2.0)
    assert [f.seq for f in whole] == [0, 1, 2, 3]
    size = sum(len(f.payload) for f in whole)
    assert await request_replay(ctx, worker.replay_endpoint, 0, 2.0,
                                max_total_bytes=size - 1) is None
    assert len(await request_replay(ctx, worker.replay_endpoint, 0, 2.0,
                                    max_total_bytes=size)) == 4
    worker.close()


def snapshot_of(num_blocks: int) -> tuple[list, list[bytes]]:
    """kvroute's publisher's snapshot of one `num_blocks`-block chain: a clear, then one
    store per block, parents first; and the chain's router hashes."""
    token_ids = tokens(7, num_blocks)
    names = [f"s-{i}".encode() for i in range(num_blocks)]
    events = [wire.AllBlocksCleared()]
    for i, name in enumerate(names):
        events.append(stored([name], names[i - 1] if i else None,
                             token_ids[i * B:(i + 1) * B]))
    return events, router_hashes(token_ids)


async def test_a_snapshot_may_hold_more_blocks_than_a_batch():
    """A worker's snapshot holds its whole cache, many batches' worth: its own cap."""
    worker = MockVllmWorker()
    worker.snapshot_events, hashes = snapshot_of(20)  # over max_blocks_per_batch=8
    worker.publish([], drop=True)  # the snapshot is valid at seq 0
    async with following(worker, max_snapshot_blocks=20) as (sub, sink):
        await started(sub, worker)
        assert sub.mode == EVENTS and sub.stats.num_snapshots == 1
        assert sub.stats.num_oversized == 0
        assert sink.contents()["device"] == set(hashes)
    worker.close()


async def test_a_snapshot_over_its_cap_is_refused():
    worker = MockVllmWorker()
    worker.snapshot_events, _ = snapshot_of(21)
    worker.publish([], drop=True)
    async with following(worker, max_snapshot_blocks=20) as (sub, sink):
        await started(sub, worker)
        assert sub.stats.num_snapshots == 0 and sub.stats.num_oversized == 1
        assert sink.contents()["device"] == set()
    worker.close()
