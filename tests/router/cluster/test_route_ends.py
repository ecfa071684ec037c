"""Route ends: queued per router by the index actor, taken by that router's next poll; the
other routers get them at once as that router's work ends."""

import asyncio

from kv.events import EventBatch
from router.cluster.index_actor import IndexActorConfig, KVIndex, PollRequest
from router.cluster.route_ends import RouteEnds, claim_of, end_of, refusal_of, split_reports
from router.cluster.shared_marks import WorkEnd


def test_each_router_takes_its_own_ends_once():
    ends = RouteEnds(router_timeout_s=60.0)
    assert ends.take("router-a") == () and ends.take("router-b") == ()  # both polling
    assert ends.add({"router-a": ["r1", "r2"], "router-b": ["r3"]})
    assert ends.add({"router-a": ["r4"]})
    assert ends.take("router-a") == ("r1", "r2", "r4")
    assert ends.take("router-a") == ()
    assert ends.take("router-b") == ("r3",)
    assert ends.num_queued() == 0


def test_ends_for_a_router_not_yet_polling_wait_for_its_first_poll():
    # a router's first request can end before its first poll reaches the index actor
    ends = RouteEnds(router_timeout_s=60.0)
    assert ends.add({"new-router": ["r1"]})
    assert ends.take("new-router") == ("r1",)


def test_ends_for_a_router_that_stopped_polling_are_dropped():
    ends = RouteEnds(router_timeout_s=0.0)  # every router counts as gone at once
    ends.take("router-a")
    assert not ends.add({"router-a": ["r2"]})  # its last poll is older than the timeout
    ends.take("router-b")  # any poll drops the outboxes of routers gone quiet
    assert ends.num_queued() == 0


async def test_a_poll_returns_at_once_with_the_ends_a_replica_published():
    index = KVIndex()
    first = await index.poll(PollRequest("router-a", {}))
    assert first.ended_route_ids == ()
    index.publish(EventBatch("replica-1", "epoch", 0, ()), None,
                  {"router-a": ("r1",), "router-b": ("r2",)})  # router-b not polling yet
    reply = await index.poll(PollRequest("router-a", {}, wait_s=30.0))
    assert reply.ended_route_ids == ("r1",)
    assert (await index.poll(PollRequest("router-b", {}))).ended_route_ids == ("r2",)
    assert index.route_ends.num_queued() == 0


def test_an_end_carries_its_cached_and_output_tokens_each_when_known():
    reported = [claim_of("a1"), end_of("a1", 48, 16), end_of("b2", None, 7),
                end_of("c3", 32), end_of("d4", None), refusal_of("e5")]
    split = split_reports(reported)
    assert split.claimed == ["a1"] and split.refused == ["e5"]
    assert split.ended == ["a1", "b2", "c3", "d4"]
    assert split.cached_tokens == {"a1": 48, "c3": 32}
    assert split.output_tokens == {"a1": 16, "b2": 7}


def test_a_router_that_stopped_polling_gets_no_outbox_again(monkeypatch):
    """Its ledger died with it: ends still reported for its routes are dropped, not queued
    for another router_timeout_s each time its old outbox is dropped."""
    now = [100.0]
    monkeypatch.setattr("router.cluster.route_ends.time.monotonic", lambda: now[0])
    ends = RouteEnds(router_timeout_s=10.0)
    ends.take("router-a")
    ends.take("router-b")
    now[0] = 111.0  # router-a died; router-b polls on
    ends.take("router-b")
    for i in range(3):
        news = ends.add({"router-a": [f"r{i}"], "router-b": [f"s{i}"]})
        assert ends.num_queued() == 1 and news == ["router-b"]
        now[0] += 20.0
        assert ends.take("router-b") == (f"s{i}",)
    assert ends.num_queued() == 0
    assert ends.take("router-a") == ()  # polling again (it was only paused): kept from now
    assert ends.add({"router-a": ["r9"]}) == ["router-a"]


async def test_reported_ends_wake_only_their_routers_long_poll():
    index = KVIndex()
    for router_id in ("router-a", "router-b"):
        await index.poll(PollRequest(router_id, {}))  # both known, outboxes empty
    polls = {r: asyncio.ensure_future(index.poll(PollRequest(r, {}, wait_s=30.0)))
             for r in ("router-a", "router-b")}
    while len(index._waiters) < 2:
        await asyncio.sleep(0)  # both polls wait
    index.report_routes({"router-a": (claim_of("r1"), end_of("r1", 0, 4))})
    reply = await polls["router-a"]
    assert reply.ended_route_ids == (claim_of("r1"), end_of("r1", 0, 4))
    await asyncio.sleep(0)
    assert not polls["router-b"].done()  # nothing for it: still waiting
    polls["router-b"].cancel()


async def test_an_end_reaches_its_router_and_the_others_in_one_publish():
    """The routing router takes the end for its ledger; the others, which count its routes'
    work, get it as its work end from the same publish (it sends nothing back)."""
    index = KVIndex()
    for router_id in ("router-a", "router-b"):
        await index.poll(PollRequest(router_id, {}))
    polls = {r: asyncio.ensure_future(index.poll(PollRequest(r, {}, wait_s=30.0)))
             for r in ("router-a", "router-b")}
    await _until_waiting(index, 2)
    index.publish(EventBatch("replica-1", "epoch", 0, ()), None,
                  {"router-a": (claim_of("q1"), end_of("q1", 0, 5), refusal_of("q2"))})
    mine, other = await polls["router-a"], await polls["router-b"]
    assert mine.ended_route_ids == (claim_of("q1"), end_of("q1", 0, 5), refusal_of("q2"))
    assert not any(isinstance(m, WorkEnd) for m in mine.shared_marks)
    assert other.ended_route_ids == ()
    assert [m for m in other.shared_marks if isinstance(m, WorkEnd)] == [
        WorkEnd("q1", "replica-1", False, 5, any_placement=True),
        WorkEnd("q2", "replica-1", True, any_placement=True)]


def test_a_gone_routers_ends_go_to_the_other_routers_as_its_work_ends(monkeypatch):
    """Its routes' work counts on the other routers until its work ends: ends reported for
    it, queued when it went or reported since, reach them in its name."""
    now = [100.0]
    monkeypatch.setattr("router.cluster.route_ends.time.monotonic", lambda: now[0])
    index = KVIndex()
    for router_id in ("router-a", "router-b"):
        index.route_ends.take(router_id)
        index.shared_marks.take(router_id)
    now[0] = 105.0  # router-a dies with an end queued for it
    index.publish(EventBatch("replica-1", "epoch", 0, ()), None,
                  {"router-a": (claim_of("q1"), end_of("q1", 0, 7, 1.0))})
    now[0] = 111.0
    index.route_ends.take("router-b")  # router-a is gone: its queued end is dropped
    index.report_routes({"router-a": (refusal_of("q2"),)}, "replica-2")  # after it went
    assert index.route_ends.num_queued() == 0
    assert index.shared_marks.take("router-b") == (
        WorkEnd("q1", "replica-1", False, 7, any_placement=True),
        WorkEnd("q2", "replica-2", True, any_placement=True))


def test_a_routers_reports_are_due_a_gap_after_it_last_took_some(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("router.cluster.route_ends.time.monotonic", lambda: now[0])
    ends = RouteEnds(router_timeout_s=60.0, min_take_gap_s=0.01)
    assert ends.take("router-a") == () and ends.due_s("router-a") is None  # none queued
    ends.add({"router-a": ["r1"]})
    assert ends.due_s("router-a") == float("-inf")  # it took none yet: due now
    assert ends.take("router-a") == ("r1",)
    now[0] = 100.004
    assert ends.take("router-a") == ()  # an empty take does not restart the gap
    ends.add({"router-a": ["r2"]})
    assert ends.due_s("router-a") == 100.01


async def test_a_routers_poll_wakes_for_ends_alone_at_most_once_a_gap(monkeypatch):
    """Ends alone wake a router's long poll once its gap since its last ends has passed;
    until then they wait (the poll too), and go with any other news at once."""
    now = [100.0]
    for module in ("route_ends", "index_actor"):
        monkeypatch.setattr(f"router.cluster.{module}.time.monotonic", lambda: now[0])
    index = KVIndex(IndexActorConfig(min_end_wake_gap_s=10.0, max_poll_wait_s=60.0))
    await index.poll(PollRequest("router-a", {}))
    index.report_routes({"router-a": ("r1",)}, "replica-1")  # a quiet router: at once
    assert (await index.poll(PollRequest("router-a", {}, 30.0))).ended_route_ids == ("r1",)

    now[0] = 101.0  # within the gap: the next ends do not wake its poll
    poll = asyncio.ensure_future(index.poll(PollRequest("router-a", {}, 30.0)))
    await _until_waiting(index, 1)
    index.report_routes({"router-a": ("r2",)}, "replica-1")
    index.report_routes({"router-a": ("r3",)}, "replica-2")
    await _until_waiting(index, 1)  # woken, and waiting again for the gap's rest
    index.share_marks("router-b", (WorkEnd("q1", "replica-1", False, 3),))  # other news
    reply = await poll
    assert reply.ended_route_ids == ("r2", "r3")
    assert reply.shared_marks == (WorkEnd("q1", "replica-1", False, 3),)

    now[0] = 110.995  # a poll that finds ends queued in the gap waits for its end
    index.report_routes({"router-a": ("r4",)}, "replica-1")
    poll = asyncio.ensure_future(index.poll(PollRequest("router-a", {}, 30.0)))
    await _until_waiting(index, 1)
    now[0] = 111.0  # its wait (5 ms, the gap's rest) times out at the gap's end
    assert (await poll).ended_route_ids == ("r4",)


async def _until_waiting(index: KVIndex, num_polls: int) -> None:
    for _ in range(10):
        await asyncio.sleep(0)
    assert len(index._waiters) == num_polls
