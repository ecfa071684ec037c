"""Shared pending marks: logged by the index actor, handed to the other routers' polls."""

import asyncio

import pytest

from router.cluster.index_actor import KVIndex, PollRequest
from router.cluster.shared_marks import (
    RoutedWork,
    SharedGap,
    SharedMark,
    SharedMarks,
    SharedMarksConfig,
    WorkEnd,
)

H = [bytes([i]) * 16 for i in range(16)]


class Clock:
    def __init__(self):
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_a_router_gets_the_others_marks_once_and_never_its_own():
    marks = SharedMarks(clock=Clock())
    # a router new to the actor cannot know what it missed
    assert marks.take("a") == marks.take("b") == (SharedGap(None),)
    assert marks.add("a", [SharedMark("r1", (H[0], H[1]))])
    assert marks.add("b", [SharedMark("r2", (H[2],))])
    assert marks.take("a") == (SharedMark("r2", (H[2],)),)
    assert marks.take("b") == (SharedMark("r1", (H[0], H[1])),)
    assert marks.take("a") == () and marks.take("b") == ()
    assert not marks.add("a", [SharedMark("r1", ())])  # nothing to share: no news
    marks.check_invariants()


def test_marks_older_than_the_ttl_are_not_handed_out():
    clock = Clock()
    marks = SharedMarks(SharedMarksConfig(ttl_s=2.0), clock=clock)
    marks.take("b")
    marks.add("a", [SharedMark("r1", (H[0],))])
    clock.now_s += 1.0
    marks.add("a", [SharedMark("r1", (H[1],))])
    clock.now_s += 1.5  # the first is 2.5 s old, the second 1.5 s
    # b learns that it missed one (an end among them would leave a route counted for ever)
    assert marks.take("b") == (SharedGap(1), SharedMark("r1", (H[1],)))
    assert marks.num_blocks() == 1
    marks.check_invariants()


def test_every_bound_holds():
    config = SharedMarksConfig(max_mark_blocks=4, max_kept_blocks=6, max_reply_blocks=5)
    marks = SharedMarks(config, clock=Clock())
    marks.take("b")
    marks.add("a", [SharedMark("r1", tuple(H[:10]))])  # cut to its first 4 blocks
    marks.add("a", [SharedMark("r2", tuple(H[10:13]))])  # 7 kept > 6: the oldest goes
    assert marks.num_blocks() == 3
    assert marks.take("b") == (SharedGap(1), SharedMark("r2", tuple(H[10:13])))
    marks.add("a", [SharedMark("r1", tuple(H[:3])), SharedMark("r2", tuple(H[3:6]))])
    # 6 blocks wait, a reply carries 5: the second mark comes with the next poll
    assert marks.take("b") == (SharedMark("r1", tuple(H[:3])),)
    assert marks.take("b") == (SharedMark("r2", tuple(H[3:6])),)
    marks.check_invariants()
    with pytest.raises(ValueError, match="max_mark_blocks"):
        SharedMarksConfig(max_mark_blocks=8, max_kept_blocks=4)


def test_a_router_silent_past_its_timeout_starts_again_from_the_live_marks():
    clock = Clock()
    marks = SharedMarks(SharedMarksConfig(ttl_s=1.0, router_timeout_s=5.0), clock=clock)
    marks.take("b")
    clock.now_s += 6.0
    marks.add("a", [SharedMark("r1", (H[0],))])  # b's cursor goes: it was silent 6 s
    clock.now_s += 0.5
    assert marks.take("b") == (SharedGap(None), SharedMark("r1", (H[0],)))


async def test_a_share_wakes_the_other_routers_poll_and_not_the_senders():
    index = KVIndex()
    await index.poll(PollRequest("a", {}))
    await index.poll(PollRequest("b", {}))
    poll_a = asyncio.ensure_future(index.poll(PollRequest("a", {}, wait_s=30.0)))
    poll_b = asyncio.ensure_future(index.poll(PollRequest("b", {}, wait_s=30.0)))
    while len(index._waiters) < 2:  # both polls are waiting for news
        await asyncio.sleep(0)
    index.share_marks("a", (SharedMark("r1", (H[0], H[1])),))
    reply = await poll_b
    assert reply.shared_marks == (SharedMark("r1", (H[0], H[1])),)
    assert not poll_a.done() and list(index._waiters.values()) == ["a"]
    index.share_marks("b", (SharedMark("r2", (H[2],)),))
    assert (await poll_a).shared_marks == (SharedMark("r2", (H[2],)),)
    index.check_invariants()


def test_work_ends_follow_their_marks_in_order_and_count_one_each():
    config = SharedMarksConfig(max_mark_blocks=4, max_kept_blocks=6, max_reply_blocks=3)
    marks = SharedMarks(config, clock=Clock())
    marks.take("b")
    work = RoutedWork("q1", 10.0, 2.0, 10.0)
    assert marks.add("a", [SharedMark("r1", (H[0], H[1]), work), WorkEnd("q1", "r1")])
    assert marks.add("a", [SharedMark("r2", (), RoutedWork("q2", 1.0, 0.0, 1.0))])
    assert marks.num_blocks() == 4  # two hashes, and one for each message without any
    assert marks.take("b") == (SharedMark("r1", (H[0], H[1]), work), WorkEnd("q1", "r1"))
    assert marks.take("b") == (SharedMark("r2", (), RoutedWork("q2", 1.0, 0.0, 1.0)),)
    marks.check_invariants()
