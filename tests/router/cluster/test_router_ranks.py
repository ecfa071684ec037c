"""Each router's rank among the live routers, which the index actor tells it with every poll
reply, and the offset it lists the replicas from (router/core/candidates.py)."""

import asyncio

from router.cluster.index_actor import IndexActorConfig, KVIndex
from router.cluster.poll_messages import PollRequest
from router.cluster.shared_marks import SharedGap
from router.core.candidates import RouterRank, list_offset, rank_among, router_offset


def test_rank_i_of_g_lists_from_i_n_over_g_and_without_a_rank_or_alone_from_its_hash():
    assert [list_offset(8, 5, RouterRank(i, 8)) for i in range(8)] == list(range(8))
    assert [list_offset(8, 5, RouterRank(i, 3)) for i in range(3)] == [0, 2, 5]
    assert [list_offset(4, 5, RouterRank(i, 8)) for i in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert list_offset(8, router_offset("gw-1"), None) == router_offset("gw-1")
    assert list_offset(8, router_offset("gw-1"), RouterRank(0, 1)) == router_offset("gw-1")


def test_a_routers_rank_is_its_place_among_the_ids_sorted_itself_included():
    assert rank_among("gw-b", ["gw-c", "gw-a", "gw-b"]) == RouterRank(1, 3)
    assert rank_among("gw-b", ["gw-c", "gw-a"]) == RouterRank(1, 3)
    assert rank_among("gw-b", []) == RouterRank(0, 1)


async def test_each_reply_carries_the_routers_rank_among_those_that_polled():
    index = KVIndex()
    assert (await index.poll(PollRequest("gw-b", {}))).router_rank == RouterRank(0, 1)
    assert (await index.poll(PollRequest("gw-a", {}))).router_rank == RouterRank(0, 2)
    assert (await index.poll(PollRequest("gw-b", {}))).router_rank == RouterRank(1, 2)


async def test_a_new_router_wakes_the_others_polls_with_their_new_ranks():
    index = KVIndex(IndexActorConfig(max_poll_wait_s=60.0))
    await index.poll(PollRequest("gw-b", {}))
    waiting = asyncio.ensure_future(index.poll(PollRequest("gw-b", {}, 30.0)))
    for _ in range(10):
        await asyncio.sleep(0)
    assert len(index._waiters) == 1  # nothing new: gw-b's long poll waits
    await index.poll(PollRequest("gw-a", {}))  # a router joins
    reply = await asyncio.wait_for(waiting, 10.0)  # returns now, not after 30 s
    assert reply.router_rank == RouterRank(1, 2)


async def test_a_router_silent_for_router_timeout_s_leaves_the_ranks(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("router.cluster.index_actor.time.monotonic", lambda: now[0])
    index = KVIndex(IndexActorConfig(router_timeout_s=10.0))
    for router_id in ("gw-a", "gw-b", "gw-c"):
        await index.poll(PollRequest(router_id, {}))
    now[0] = 109.0
    await index.poll(PollRequest("gw-c", {}))
    now[0] = 110.5  # gw-a and gw-b last polled 10.5 s ago: gone
    assert (await index.poll(PollRequest("gw-c", {}))).router_rank == RouterRank(0, 1)
    assert (await index.poll(PollRequest("gw-a", {}))).router_rank == RouterRank(0, 2)
    assert list(index.router_views()) == ["gw-c", "gw-a"]


async def test_a_router_back_after_it_expired_starts_after_a_gap(monkeypatch):
    """While it was gone the others took themselves for alone and shared nothing, their
    ends too: it must drop the work it holds from them, not keep it counted."""
    now = [100.0]
    monkeypatch.setattr("router.cluster.index_actor.time.monotonic", lambda: now[0])
    index = KVIndex(IndexActorConfig(router_timeout_s=10.0))
    reply_lag = [0.0]  # a long poll takes the marks when it answers, up to 1 s after it came
    index.shared_marks._clock = lambda: now[0] + reply_lag[0]
    for router_id in ("gw-a", "gw-b"):
        await index.poll(PollRequest(router_id, {}))
    reply_lag[0] = 0.9
    assert (await index.poll(PollRequest("gw-b", {}))).shared_marks == ()  # caught up
    reply_lag[0] = 0.0
    now[0] = 109.5
    assert (await index.poll(PollRequest("gw-a", {}))).router_rank == RouterRank(0, 2)
    now[0] = 110.5  # gw-b came 10.5 s ago: gone from the ranks; its cursor is 9.6 s old
    assert (await index.poll(PollRequest("gw-a", {}))).router_rank == RouterRank(0, 1)
    reply = await index.poll(PollRequest("gw-b", {}))
    assert reply.router_rank == RouterRank(1, 2)
    assert reply.shared_marks == (SharedGap(None),)
