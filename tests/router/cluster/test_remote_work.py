"""The routed work other routers shared, in this router's load: added, ended, withdrawn,
and dropped by the safety nets when its end never comes."""

import pytest

from router.cluster.remote_work import RemoteWork, RemoteWorkConfig
from router.cluster.shared_marks import RoutedWork, WorkEnd
from router.core.load import LoadTracker


class Clock:
    def __init__(self):
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def remote_work(config: RemoteWorkConfig | None = None) -> tuple[RemoteWork, Clock]:
    clock = Clock()
    loads = LoadTracker(decode_weight=1.0, recent_half_life_s=30.0, clock=clock)
    return RemoteWork(loads, config, clock), clock


def test_work_counts_until_its_end_and_a_withdrawal_takes_its_recent_work_too():
    remote, clock = remote_work()
    remote.add("r0", RoutedWork("q1", 300.0, 20.0, 300.0))
    remote.add("r0", RoutedWork("q2", 100.0, 20.0, 100.0))
    remote.add("r1", RoutedWork("q3", 50.0, 20.0, 50.0))
    assert [remote.loads.load(r) for r in ("r0", "r1")] == [400.0, 50.0]
    assert (remote.num_on("r0"), remote.num_on("r1"), len(remote)) == (2, 1, 3)
    remote.end(WorkEnd("q1", "r0"))  # ran: its recent work stays, decaying
    remote.end(WorkEnd("q2", "r0", withdrawn=True))  # never ran: nothing stays
    remote.end(WorkEnd("q9", "r0"))  # its route comes later (or never): kept, nothing counted
    assert remote.loads.load("r0") == 300.0 and remote.loads.num_outstanding("r0") == 0
    assert (remote.num_on("r0"), len(remote)) == (0, 1)
    clock.now_s += 30.0  # one half-life
    assert remote.loads.load("r0") == 150.0
    remote.check_invariants()


def test_an_end_that_never_comes_is_dropped_on_an_idle_replica_or_when_lost():
    remote, clock = remote_work(RemoteWorkConfig(idle_grace_s=5.0, lost_after_s=60.0))
    remote.add("r0", RoutedWork("q1", 10.0, 0.0, 0.0))
    remote.add("r1", RoutedWork("q2", 10.0, 0.0, 0.0))
    clock.now_s += 4.0
    assert remote.expire(frozenset({"r0", "r1"})) == 0  # within the grace
    clock.now_s += 2.0
    assert remote.expire(frozenset({"r1"})) == 1  # r1 idle past the grace; r0 busy
    assert (remote.num_on("r0"), remote.num_on("r1")) == (1, 0)
    assert remote.loads.num_outstanding("r1") == 0
    clock.now_s += 60.0
    assert remote.expire(frozenset()) == 1 and len(remote) == 0
    assert remote.num_lost == 2
    remote.check_invariants()


def test_routes_are_bounded_and_a_gone_replica_takes_its_routes():
    remote, _ = remote_work(RemoteWorkConfig(max_routes=2))
    for i, replica_id in enumerate(("r0", "r1", "r1")):
        remote.add(replica_id, RoutedWork(f"q{i}", 10.0, 0.0, 0.0))
    assert len(remote) == 2 and remote.num_on("r0") == 0  # the oldest went
    assert remote.loads.num_outstanding("r0") == 0
    remote.forget_replica("r1")
    assert len(remote) == 0 and remote.loads.num_outstanding("r1") == 0
    remote.check_invariants()
    with pytest.raises(ValueError, match="idle_grace_s"):
        RemoteWorkConfig(idle_grace_s=0)


def test_an_end_that_overtakes_its_route_keeps_the_route_from_counting():
    remote, _ = remote_work()
    remote.end(WorkEnd("q1", "r0"))  # the sender's later call ran first at the actor
    remote.add("r0", RoutedWork("q1", 300.0, 20.0, 300.0))
    remote.add("r0", RoutedWork("q2", 100.0, 20.0, 100.0))
    assert len(remote) == 1 and remote.loads.load("r0") == 100.0
    remote.check_invariants()


def test_an_end_releases_only_the_placement_it_ended():
    """A route id placed twice (Serve spilled it from r0 to r1): the sender queues the
    first placement's end and the second's route together, and that call reaches the
    actor before the one with the first route. The end for r0 must not release r1."""
    remote, _ = remote_work()
    remote.end(WorkEnd("q1", "r0", withdrawn=True))  # r0's end, overtaking r0's route
    remote.add("r1", RoutedWork("q1", 300.0, 20.0, 300.0))  # in the same call
    remote.add("r0", RoutedWork("q1", 300.0, 20.0, 300.0))  # the earlier call, late
    assert (remote.num_on("r0"), remote.num_on("r1")) == (0, 1)
    assert [remote.loads.load(r) for r in ("r0", "r1")] == [0.0, 300.0]
    remote.check_invariants()
    remote.end(WorkEnd("q1", "r0"))  # a stale end for r0 again: r1 still counts
    assert remote.num_on("r1") == 1 and remote.loads.load("r1") == 300.0
    remote.end(WorkEnd("q1", "r1"))  # r1's own end releases it
    assert (remote.num_on("r1"), len(remote), remote.loads.num_outstanding("r1")) == (0, 0, 0)
    remote.check_invariants()


def test_a_retried_routes_late_first_end_leaves_the_retry_counted():
    """Routed to r0, failed there, retried on r1 under the same id: r0's end arrives after
    r1's route."""
    remote, _ = remote_work()
    remote.add("r0", RoutedWork("q1", 100.0, 20.0, 100.0))
    remote.add("r1", RoutedWork("q1", 200.0, 20.0, 200.0))  # replaces r0's placement
    remote.end(WorkEnd("q1", "r0", withdrawn=True))
    assert (remote.num_on("r0"), remote.num_on("r1")) == (0, 1)
    assert remote.loads.num_outstanding("r1") == 1
    remote.check_invariants()


def test_a_direct_routes_end_releases_it_wherever_it_is_counted():
    """Counted on r0 (its router ranked r0 first); Serve sent it to r1, which reports the
    end: the end the actor relays releases it on r0, before or after its route comes."""
    remote, _ = remote_work()
    remote.add("r0", RoutedWork("q1", 100.0, 20.0, 100.0))
    remote.end(WorkEnd("q1", "r1", output_tokens=5, any_placement=True))
    assert remote.num_on("r0") == 0 and remote.loads.num_outstanding("r0") == 0
    remote.end(WorkEnd("q2", "r1", withdrawn=True, any_placement=True))  # before its route
    remote.add("r0", RoutedWork("q2", 100.0, 20.0, 100.0))
    assert remote.num_on("r0") == 0 and remote.loads.num_outstanding("r0") == 0
    remote.end(WorkEnd("q3", "r1"))  # a placement's own end still names it
    remote.add("r0", RoutedWork("q3", 100.0, 20.0, 100.0))
    assert remote.num_on("r0") == 1
    remote.check_invariants()
