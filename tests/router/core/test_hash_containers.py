"""What the router keeps per decision must not be containers of hashes for the cyclic
collector: a young-generation collection walks every tracked container made since the last
one, element by element, and its whole cost lands inside one decision."""

from __future__ import annotations

import gc
import os

from router.core.history import RoutedHistory
from router.core.pending import PendingMarks


def _containers_holding(block_hash: bytes, *mine: object) -> list[object]:
    """The tracked tuples and lists that refer to block_hash, other than `mine`."""
    return [r for r in gc.get_referrers(block_hash)
            if isinstance(r, (tuple, list)) and not any(r is m for m in mine)]


def test_history_remembers_a_prompt_without_a_container_of_its_hashes():
    history = RoutedHistory(capacity_blocks=4096, ttl_s=60.0, clock=lambda: 0.0, active=False)
    hashes = [os.urandom(16) for _ in range(512)]
    history.record("r0", hashes)
    assert _containers_holding(hashes[-1], hashes) == []
    history.set_active(True)
    history.warm_step()
    assert history.blocks_of("r0") == frozenset(hashes)  # the hashes come back when used


def test_pending_expiry_queue_keeps_the_released_hashes_not_a_copy():
    marks = PendingMarks(ttl_s=2.0)
    held = tuple(os.urandom(16) for _ in range(512))
    marks.hold(1, held)
    marks.release(1, held, now=10.0)
    assert _containers_holding(held[-1], held) == []
    marks.check_invariants()
    marks.expire(11.9)
    assert marks.marked(1) == frozenset(held)
    marks.expire(12.0)
    assert marks.marked(1) == frozenset()
