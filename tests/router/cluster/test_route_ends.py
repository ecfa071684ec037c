"""Route ends: queued per router by the index actor, taken by that router's next poll."""

from kv.events import EventBatch
from router.cluster.index_actor import KVIndex, PollRequest
from router.cluster.route_ends import RouteEnds


def test_each_router_takes_its_own_ends_once():
    ends = RouteEnds(router_timeout_s=60.0)
    assert ends.take("router-a") == () and ends.take("router-b") == ()  # both polling
    assert ends.add({"router-a": ["r1", "r2"], "router-b": ["r3"]})
    assert ends.add({"router-a": ["r4"]})
    assert ends.take("router-a") == ("r1", "r2", "r4")
    assert ends.take("router-a") == ()
    assert ends.take("router-b") == ("r3",)
    assert ends.num_queued() == 0


def test_ends_for_a_router_that_never_polled_or_stopped_are_dropped():
    ends = RouteEnds(router_timeout_s=0.0)  # every router counts as gone at once
    assert not ends.add({"never-polled": ["r1"]})
    ends.take("router-a")
    assert not ends.add({"router-a": ["r2"]})  # its last poll is older than the timeout
    assert ends.num_queued() == 0


async def test_a_poll_returns_at_once_with_the_ends_a_replica_published():
    index = KVIndex()
    first = await index.poll(PollRequest("router-a", {}))
    assert first.ended_route_ids == ()
    index.publish(EventBatch("replica-1", "epoch", 0, ()), None,
                  {"router-a": ("r1",), "router-b": ("r2",)})  # router-b never polled
    reply = await index.poll(PollRequest("router-a", {}, wait_s=30.0))
    assert reply.ended_route_ids == ("r1",)
    assert index.route_ends.num_queued() == 0
