"""Pending marks' one-pass hold and expiry: the mixed cases (a hold meeting timed and held
marks, an expiry meeting refreshed and held ones) keep every mark's exact state."""

from __future__ import annotations

import math

from router.core.pending import PendingMarks
from tests.router.core.core_helpers import h

BIT = 1


def _state(marks: PendingMarks) -> dict[bytes, float]:
    marks.check_invariants()
    return dict(marks.by_bit.get(BIT, {}))


def test_hold_over_absent_timed_and_held_marks_counts_holders():
    marks = PendingMarks(ttl_s=2.0)
    absent, timed, held = h(1), h(2), h(3)
    marks.mark(BIT, [timed], now=0.0)
    marks.hold(BIT, [held])
    marks.hold(BIT, [absent, timed, held, held])  # `held` twice: two more holders
    assert _state(marks) == {timed: math.inf, held: math.inf, absent: math.inf}
    marks.release(BIT, [absent, timed, held, held], now=1.0)
    # `held` keeps its first holder; the others run their TTL from now
    assert _state(marks) == {timed: 3.0, held: math.inf, absent: 3.0}
    marks.release(BIT, [held], now=1.5)
    assert _state(marks) == {timed: 3.0, held: 3.5, absent: 3.0}
    marks.expire(3.0)
    assert _state(marks) == {held: 3.5}
    marks.expire(3.5)
    assert _state(marks) == {}


def test_expiry_keeps_marks_refreshed_or_held_since_and_drops_the_rest():
    marks = PendingMarks(ttl_s=2.0)
    stays, refreshed, held_again, confirmed = h(1), h(2), h(3), h(4)
    marks.mark(BIT, [stays, refreshed, held_again, confirmed], now=0.0)
    marks.mark(BIT, [refreshed], now=1.0)  # expires at 3 now
    marks.hold(BIT, [held_again])
    marks.confirm(BIT, [confirmed])
    marks.expire(2.0)
    assert _state(marks) == {refreshed: 3.0, held_again: math.inf}
    marks.expire(3.0)
    assert _state(marks) == {held_again: math.inf}
    marks.release(BIT, [held_again], now=3.0, withdraw=True)
    assert _state(marks) == {}
    assert BIT not in marks.by_bit and marks.bits_mask == 0
