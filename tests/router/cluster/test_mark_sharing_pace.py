"""A router's work ends go to the index actor a gap apart, or with the next decision's marks:
each send is a call to the actor and wakes every other router's poll."""

import asyncio
import os

import pytest

from router.cluster.actor_link import ActorLink
from router.cluster.mark_sharing import MarkSender, MarkSharingConfig
from router.cluster.shared_marks import SharedMark, WorkEnd

PREFIX = tuple(os.urandom(16) for _ in range(4))
GAP_S = 0.01


class _Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


class _Recorded:
    """An index actor whose `share_marks` calls return at once, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.called = asyncio.Event()
        self.share_marks = self

    def remote(self, router_id, marks):
        self.calls.append(marks)
        self.called.set()

        async def call():
            return None
        return call()


async def _turns(n: int = 3) -> None:
    for _ in range(n):  # a send task's turn of the loop, and its call's
        await asyncio.sleep(0)


def _sender(index: _Recorded, clock: _Clock, gap_s: float = GAP_S) -> MarkSender:
    sender = MarkSender("router-a", ActorLink("test", lambda: index, index),
                        MarkSharingConfig(min_end_send_gap_s=gap_s), clock=clock)
    sender.start()
    return sender


async def test_a_lone_end_leaves_at_once():
    index, clock = _Recorded(), _Clock()
    sender = _sender(index, clock)
    sender.share_end("q1", "r0")
    await _turns()
    assert index.calls == [(WorkEnd("q1", "r0"),)]


async def test_ends_within_the_gap_ride_with_the_next_decisions_marks():
    index, clock = _Recorded(), _Clock()
    sender = _sender(index, clock)
    sender.share("r0", PREFIX[:2])
    await _turns()
    clock.now_s += GAP_S / 10
    sender.share_end("q1", "r0")
    sender.share_end("q2", "r1", withdrawn=True)
    await _turns()
    assert len(index.calls) == 1  # the ends wait: the last send was just now
    sender.share("r1", PREFIX[2:])
    await _turns()
    assert index.calls[1] == (WorkEnd("q1", "r0"), WorkEnd("q2", "r1", True),
                              SharedMark("r1", PREFIX[2:]))
    await sender.drain()
    assert len(index.calls) == 2 and sender.num_sends == 2  # nothing left for the gap's end


async def test_ends_alone_go_together_at_the_gaps_end():
    index, clock = _Recorded(), _Clock()
    sender = _sender(index, clock)
    sender.share_end("q1", "r0")
    await _turns()
    index.called.clear()
    clock.now_s += GAP_S / 2
    sender.share_end("q2", "r0")
    sender.share_end("q3", "r1")
    await _turns()
    assert len(index.calls) == 1
    await asyncio.wait_for(index.called.wait(), 5)  # the loop's timer, at the gap's end
    assert index.calls[1] == (WorkEnd("q2", "r0"), WorkEnd("q3", "r1"))


async def test_drain_sends_the_ends_waiting_for_their_gap():
    index, clock = _Recorded(), _Clock()
    sender = _sender(index, clock, gap_s=1.0)
    sender.share_end("q1", "r0")
    await _turns()
    sender.share_end("q2", "r0")
    await _turns()
    assert len(index.calls) == 1
    await sender.drain()
    assert index.calls[1] == (WorkEnd("q2", "r0"),)


async def test_a_stopped_sender_sends_no_ends_at_the_gaps_end():
    index, clock = _Recorded(), _Clock()
    sender = _sender(index, clock)
    sender.share_end("q1", "r0")
    await _turns()
    sender.share_end("q2", "r0")
    sender.stop()
    await asyncio.sleep(2 * GAP_S)  # past the gap: the timer was cancelled, not run
    assert index.calls == [(WorkEnd("q1", "r0"),)]


async def test_no_gap_sends_each_end_as_it_comes():
    index, clock = _Recorded(), _Clock()
    sender = _sender(index, clock, gap_s=0.0)
    sender.share_end("q1", "r0")
    await _turns()
    sender.share_end("q2", "r0")
    await _turns()
    assert index.calls == [(WorkEnd("q1", "r0"),), (WorkEnd("q2", "r0"),)]


@pytest.mark.parametrize("gap_s", [-0.01, 1.5])
def test_the_gap_is_checked(gap_s):
    with pytest.raises(ValueError, match="min_end_send_gap_s"):
        MarkSharingConfig(min_end_send_gap_s=gap_s)
