from collections import OrderedDict

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from router.core.history import RoutedHistory
from router.core.index import PrefixMatch
from tests.router.core.core_helpers import FakeClock, h


def blocks_of(history: RoutedHistory, replica_id: str) -> set[bytes]:
    history.check_invariants()
    return set(history.blocks_of(replica_id))


def test_lru_evicts_least_recently_routed_tail_first_and_refresh_protects():
    history = RoutedHistory(capacity_blocks=6, ttl_s=100.0, clock=FakeClock())
    history.record("r", [h(0), h(1), h(2), h(3)])
    history.record("r", [h(0), h(1)])  # refreshed: now the most recent
    history.record("r", [h(10), h(11), h(12)])  # 7 > 6: the oldest unrefreshed, tail first
    assert blocks_of(history, "r") == {h(0), h(1), h(2), h(10), h(11), h(12)}
    history.record("r", [h(20), h(21)])  # h(2), then h(1) (tail of the refresh) go
    assert blocks_of(history, "r") == {h(0), h(10), h(11), h(12), h(20), h(21)}
    assert history.match([h(0), h(1)], ["r"]) == {"r": PrefixMatch(1, 0)}


def test_entries_expire_ttl_after_their_last_routing():
    clock = FakeClock()
    history = RoutedHistory(capacity_blocks=100, ttl_s=10.0, clock=clock)
    history.record("r", [h(0), h(1), h(2)])
    clock.advance(6.0)
    history.record("r", [h(0)])
    clock.advance(4.0)  # t = 10: h(1), h(2) expire; h(0) lives until 16
    assert history.match([h(0), h(1)], ["r"]) == {"r": PrefixMatch(1, 0)}
    assert blocks_of(history, "r") == {h(0)}
    clock.advance(6.0)
    assert history.match([h(0)], ["r"]) == {}
    assert blocks_of(history, "r") == set()


def test_blocks_not_routed_within_twice_capacity_are_forgotten_early():
    history = RoutedHistory(capacity_blocks=4, ttl_s=100.0, clock=FakeClock())
    history.record("r", [h(0), h(1)])
    for _ in range(3):  # 8 routed blocks, 4 distinct: capacity never exceeded
        history.record("r", [h(5), h(6)])
    assert blocks_of(history, "r") == {h(0), h(1), h(5), h(6)}
    history.record("r", [h(5), h(6)])  # 10 queued > 2 x 4: the oldest prompt goes
    assert blocks_of(history, "r") == {h(5), h(6)}


def test_replicas_are_independent_and_removal_forgets():
    history = RoutedHistory(capacity_blocks=2, ttl_s=100.0, clock=FakeClock())
    history.record("a", [h(0), h(1)])
    history.record("b", [h(0), h(2), h(3)])
    assert history.match([h(0), h(1)], ["a", "b"]) == {"a": PrefixMatch(2, 0),
                                                      "b": PrefixMatch(1, 0)}
    history.remove_replica("a")
    assert history.match([h(0), h(1)], ["a", "b"]) == {"b": PrefixMatch(1, 0)}
    assert blocks_of(history, "a") == set()


def test_an_inactive_history_keeps_no_index_and_builds_it_on_activation():
    history = RoutedHistory(capacity_blocks=3, ttl_s=100.0, clock=FakeClock(), active=False)
    history.record("a", [h(0), h(1)])
    history.record("b", [h(0), h(2), h(3), h(4)])  # over capacity: h(4) goes
    assert history.index.replica_ids == [] and history.num_blocks() == 4
    assert blocks_of(history, "b") == {h(0), h(2), h(3)}
    with pytest.raises(RuntimeError, match="needs an active history"):
        history.match([h(0)], ["a"])
    history.set_active(True)
    assert history.warming and history.index.replica_ids == []
    history.warm_step(budget_blocks=1)  # replica "a"
    history.check_invariants()
    assert history.warming and history.match([h(0)], ["a", "b"]) == {"a": PrefixMatch(1, 0)}
    history.warm_step(budget_blocks=1)
    history.check_invariants()
    assert not history.warming
    assert history.match([h(0), h(2), h(3)], ["a", "b"]) == {"a": PrefixMatch(1, 0),
                                                            "b": PrefixMatch(3, 0)}
    history.set_active(False)
    history.check_invariants()
    assert history.index.replica_ids == []


def test_warm_up_in_steps_survives_expiry_and_new_records_in_between():
    clock = FakeClock()
    history = RoutedHistory(capacity_blocks=100, ttl_s=10.0, clock=clock, active=False)
    history.record("a", [h(1)])
    clock.advance(5.0)
    history.record("a", [h(2)])
    clock.advance(1.0)
    history.record("a", [h(3)])
    history.set_active(True)
    history.warm_step(budget_blocks=1)  # replays [h(1)] only
    history.check_invariants()
    clock.advance(4.0)  # t = 10: [h(1)] expires; a new prompt arrives mid-warm-up
    history.record("a", [h(4)])
    history.check_invariants()
    assert history.warming
    history.warm_step(budget_blocks=100)
    history.check_invariants()
    assert not history.warming
    assert history.blocks_of("a") == {h(2), h(3), h(4)}
    assert history.match([h(2)], ["a"]) == {"a": PrefixMatch(1, 0)}


CAPACITY = 5
prompts = st.lists(st.integers(0, 9), min_size=0, max_size=4, unique=True)


class HistoryMachine(RuleBasedStateMachine):
    """Against an exact LRU (an OrderedDict, most recent last, a prompt's head most recent):
    the history holds the most recent blocks of the exact LRU's order, never others (it may
    forget the oldest of them early), within capacity and TTL."""

    def __init__(self):
        super().__init__()
        self.clock = FakeClock()
        self.history = RoutedHistory(CAPACITY, ttl_s=5.0, clock=self.clock)
        self.lru = {r: OrderedDict() for r in "ab"}  # hash -> expires_at

    @rule(r=st.sampled_from("ab"), ids=prompts)
    def record(self, r, ids):
        hashes = [h(i) for i in ids]
        self.history.record(r, hashes)
        lru = self.lru[r]
        self._expire(lru)
        for x in reversed(hashes):
            lru.pop(x, None)
            lru[x] = self.clock.now + 5.0
        while len(lru) > CAPACITY:
            lru.popitem(last=False)

    def _expire(self, lru):
        for x in [x for x, t in lru.items() if t <= self.clock.now]:
            del lru[x]

    @rule(active=st.booleans())
    def set_active(self, active):
        self.history.set_active(active)

    @rule(budget=st.sampled_from([1, 3, 2048]))
    def warm_step(self, budget):
        self.history.warm_step(budget)

    @rule(seconds=st.sampled_from([0.0, 1.0, 3.0]))
    def advance(self, seconds):
        self.clock.advance(seconds)

    @invariant()
    def most_recent_suffix_of_exact_lru(self):
        for r, lru in self.lru.items():
            self._expire(lru)
            got = set(self.history.blocks_of(r))  # applies expiry first
            self.history.check_invariants()
            order = list(lru)
            assert got == set(order[len(order) - len(got):]), r


TestHistoryMachine = HistoryMachine.TestCase
TestHistoryMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
