"""The ledger's state machine through the Router that owns it: every transition, each
timeout of its policy, a retry under the same id, a replica dropped with records on it, and
a spill. Each step checks what the release did to the load and the pending marks."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from router.core.ledger import Expired, Ledger, LedgerConfig, Release, RouteKind, RouteState
from router.core.router import Router, RouterConfig
from tests.router.core.core_helpers import BLOCK_SIZE, FakeClock, chain

CONFIG = LedgerConfig(abandoned_after_s=60.0, claim_window_s=5.0, idle_grace_s=8.0,
                      lost_after_s=600.0, sweep_at_records=4)
PROMPT = chain(list(range(8)))  # 2 blocks
TOKENS = 2 * BLOCK_SIZE


def make() -> tuple[Router, FakeClock]:
    clock = FakeClock(100.0)
    return Router(RouterConfig(block_size=BLOCK_SIZE), clock, CONFIG), clock


def state(router: Router, request_id: str) -> tuple[str, RouteKind, RouteState] | None:
    record = router.ledger.get(request_id)
    return None if record is None else (record.replica_id, record.kind, record.state)


def outstanding(router: Router) -> dict[str, int]:
    return {r: router.loads.num_outstanding(r) for r in ("a", "b")}


def test_a_serve_call_is_routed_moved_dispatched_and_ended():
    router, _ = make()
    router.route("q", PROMPT, TOKENS, ["a", "b"], 4, RouteKind.CALL)
    assert state(router, "q") == ("a", RouteKind.CALL, RouteState.ROUTED)
    assert router.index.pending_blocks("a") == frozenset(PROMPT)
    router.move("q", "b")  # a was full
    assert state(router, "q") == ("b", RouteKind.CALL, RouteState.MOVED)
    assert router.index.pending_blocks("a") == frozenset()
    assert router.index.pending_blocks("b") == frozenset(PROMPT)
    assert outstanding(router) == {"a": 0, "b": 1}
    record = router.dispatched("q", "b")
    assert record == router.ledger.get("q") and record.state is RouteState.DISPATCHED
    assert router.dispatched("q", "b") is None  # once only
    assert not router.claim("q")  # a call has no claim
    router.on_finished("q")
    assert state(router, "q") is None and outstanding(router) == {"a": 0, "b": 0}
    # an ended request's marks live out their TTL: its replica computed those blocks
    assert router.index.pending_blocks("b") == frozenset(PROMPT)
    router.check_invariants()


def test_dispatch_to_another_replica_moves_the_record_there():
    router, _ = make()
    router.route("q", PROMPT, TOKENS, ["a", "b"], 4, RouteKind.CALL)
    assert router.dispatched("q", "b").replica_id == "b"
    assert state(router, "q") == ("b", RouteKind.CALL, RouteState.DISPATCHED)
    assert outstanding(router) == {"a": 0, "b": 1}
    router.check_invariants()


def test_a_direct_route_is_claimed_then_ended_or_withdrawn_at_once_when_refused():
    router, _ = make()
    router.route("d1", PROMPT, TOKENS, ["a"], 4, RouteKind.DIRECT)
    router.route("d2", chain(list(range(50, 58))), TOKENS, ["b"], 4, RouteKind.DIRECT)
    assert router.dispatched("d1", "a") is None  # no Serve dispatch for it
    assert router.claim("d1") and not router.claim("d1")
    assert state(router, "d1") == ("a", RouteKind.DIRECT, RouteState.CLAIMED)
    router.withdraw("d2")  # refused: ran nothing, its marks go at once
    assert router.index.pending_blocks("b") == frozenset()
    assert state(router, "d2") is None and not router.claim("d2")
    router.on_finished("d1")
    assert len(router.ledger) == 0 and outstanding(router) == {"a": 0, "b": 0}
    router.check_invariants()


def test_a_retry_under_the_same_id_replaces_its_record_and_charges_once():
    router, clock = make()
    router.route("q", PROMPT, TOKENS, ["a"], 4, RouteKind.CALL)
    clock.advance(1.0)
    router.route("q", PROMPT, TOKENS, ["b"], 4, RouteKind.CALL)
    assert state(router, "q") == ("b", RouteKind.CALL, RouteState.ROUTED)
    assert router.ledger.get("q").routed_at_s == 101.0
    assert outstanding(router) == {"a": 0, "b": 1}
    assert router.index.pending_blocks("a") == frozenset()  # withdrawn, not left to expire
    router.check_invariants()


def test_a_removed_replica_takes_its_records_and_a_dropped_index_their_marks():
    router, _ = make()
    router.route("q1", PROMPT, TOKENS, ["a"], 4, RouteKind.CALL)
    router.route("q2", chain(list(range(20, 28))), TOKENS, ["b"], 4, RouteKind.DIRECT)
    router.route("q3", chain(list(range(30, 38))), TOKENS, ["b"], 4, RouteKind.PROXIED)
    router.drop_index("b")  # its events stopped: records stay, their marks are gone
    assert [router.ledger.get(r).held for r in ("q2", "q3")] == [(), ()]
    router.remove_replica("a")
    assert set(router.ledger) == {"q2", "q3"} and router.ledger.on_replica("a") == []
    router.on_finished("q1")  # its late completion: nothing left to release
    assert outstanding(router) == {"a": 0, "b": 2}
    router.check_invariants()


def test_an_undispatched_call_is_ended_by_the_sweep_after_abandoned_after_s():
    router, clock = make()
    router.route("lost", PROMPT, TOKENS, ["a"], 4, RouteKind.CALL)
    router.route("sent", chain(list(range(40, 48))), TOKENS, ["b"], 4, RouteKind.CALL)
    router.dispatched("sent", "b")
    assert router.expire() == []  # starts the sweep clock: first sweep at 160
    clock.advance(59.0)
    assert router.expire() == []  # nothing is old enough, nor is a sweep due
    clock.advance(2.0)
    assert router.expire() == [Expired("lost", "a", Release.END)]
    assert set(router.ledger) == {"sent"} and outstanding(router) == {"a": 0, "b": 1}
    assert router.index.pending_blocks("a") == frozenset(PROMPT)  # ended: marks keep TTL
    clock.advance(10_000.0)
    assert router.expire(frozenset({"a", "b"})) == []  # a dispatched call waits for its end
    router.check_invariants()


def test_a_sweep_is_due_early_once_more_records_than_sweep_at_records_could_expire():
    router, clock = make()
    assert router.expire() == []
    for i in range(5):  # 5 > sweep_at_records
        router.route(f"q{i}", [], 8, ["a"], 4, RouteKind.CALL)
        if i == 0:
            clock.advance(61.0)
    clock.advance(1.0)  # 62 s after the start: the periodic sweep is not due before 160
    assert router.expire() == [Expired("q0", "a", Release.END)]


def test_direct_routes_unclaimed_idle_and_lost():
    router, clock = make()
    for route_id, replica_id in (("unclaimed", "a"), ("on-idle", "a"), ("on-busy", "b")):
        router.route(route_id, [], 8, [replica_id], 4, RouteKind.DIRECT)
    router.claim("on-idle")
    router.claim("on-busy")
    clock.advance(5.0)  # claim window not yet passed
    assert router.expire(frozenset({"a"})) == []
    clock.advance(0.5)
    # without a fresh report of the replicas, none of the short timeouts applies
    assert router.expire() == []
    assert router.expire(frozenset({"a"})) == [Expired("unclaimed", "a", Release.WITHDRAW)]
    clock.advance(3.0)  # 8.5 s: past the idle grace
    assert router.expire(frozenset({"b"})) == [Expired("on-busy", "b", Release.END)]
    router.route("later", [], 8, ["a"], 4, RouteKind.DIRECT)
    router.claim("later")
    assert router.expire(frozenset({"a"})) == [Expired("on-idle", "a", Release.END)]
    clock.advance(600.5)  # the lost timeout, busy replica, at the next sweep
    assert router.expire() == [Expired("later", "a", Release.END)]
    assert len(router.ledger) == 0 and outstanding(router) == {"a": 0, "b": 0}
    router.check_invariants()


def test_a_proxied_request_never_expires():
    router, clock = make()
    router.route("p", PROMPT, TOKENS, ["a"])  # the default kind: its caller releases it
    assert state(router, "p") == ("a", RouteKind.PROXIED, RouteState.ROUTED)
    router.expire()
    clock.advance(10_000.0)
    assert router.expire(frozenset({"a"})) == [] and router.expire() == []
    assert router.dispatched("p", "a") is None and not router.claim("p")
    router.check_invariants()


def test_the_ledger_counts_what_a_sweep_could_release():
    ledger = Ledger(CONFIG)
    router, _ = make()
    router.route("c", [], 8, ["a"], 4, RouteKind.CALL)
    record = router.ledger.get("c")
    ledger.put("c", record)
    ledger.put("c", record._replace(state=RouteState.MOVED))
    ledger.check_invariants()
    assert ledger.dispatch("c").state is RouteState.DISPATCHED
    ledger.check_invariants()
    assert ledger.pop("c") is not None and ledger.pop("c") is None
    ledger.check_invariants()


@pytest.mark.parametrize("field, value", [
    ("abandoned_after_s", 0), ("claim_window_s", -1.0), ("idle_grace_s", float("inf")),
    ("lost_after_s", float("nan")), ("sweep_at_records", 0), ("sweep_at_records", True),
    ("claim_window_s", "5"),
])
def test_a_bad_policy_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        LedgerConfig(**{field: value})


REPLICAS = ("a", "b", "c")


class LedgerMachine(RuleBasedStateMachine):
    """Any sequence of decisions, Serve hooks, replica reports, timeouts and removals: the
    ledger's records and the load tracker's outstanding requests stay one set, replica by
    replica (nothing recorded without its load, no load left without its record)."""

    def __init__(self):
        super().__init__()
        self.clock = FakeClock(100.0)
        self.router = Router(RouterConfig(block_size=BLOCK_SIZE), self.clock, CONFIG)

    @rule(i=st.integers(0, 7), kind=st.sampled_from(list(RouteKind)),
          replicas=st.lists(st.sampled_from(REPLICAS), min_size=1, max_size=3, unique=True),
          prompt=st.integers(0, 3))
    def route(self, i, kind, replicas, prompt):
        self.router.route(f"q{i}", chain(list(range(8 * prompt, 8 * prompt + 8))), TOKENS,
                          replicas, 4, kind)

    @rule(i=st.integers(0, 7), replica_id=st.sampled_from(REPLICAS))
    def move(self, i, replica_id):
        self.router.move(f"q{i}", replica_id)

    @rule(i=st.integers(0, 7), replica_id=st.sampled_from(REPLICAS))
    def dispatched(self, i, replica_id):
        before = self.router.ledger.get(f"q{i}")
        record = self.router.dispatched(f"q{i}", replica_id)
        assert (record is not None) == (before is not None and before.kind is RouteKind.CALL
                                        and before.state is not RouteState.DISPATCHED)
        if record is not None:
            assert record.replica_id == replica_id

    @rule(i=st.integers(0, 7))
    def abandon(self, i):
        before = self.router.ledger.get(f"q{i}")
        replica_id = self.router.abandon(f"q{i}")
        undispatched = (before is not None and before.kind is RouteKind.CALL
                        and before.state is not RouteState.DISPATCHED)
        assert replica_id == (before.replica_id if undispatched else None)
        assert (f"q{i}" in self.router.ledger) == (before is not None and not undispatched)

    @rule(i=st.integers(0, 7))
    def claim(self, i):
        self.router.claim(f"q{i}")

    @rule(i=st.integers(0, 7), ran=st.booleans())
    def release(self, i, ran):
        if ran:
            self.router.on_finished(f"q{i}")
        else:
            self.router.withdraw(f"q{i}")
        assert f"q{i}" not in self.router.ledger

    @rule(seconds=st.sampled_from([0.5, 4.0, 30.0, 700.0]),
          idle=st.none() | st.frozensets(st.sampled_from(REPLICAS)))
    def expire(self, seconds, idle):
        self.clock.advance(seconds)
        for request_id, _, _ in self.router.expire(idle):
            assert request_id not in self.router.ledger

    @rule(replica_id=st.sampled_from(REPLICAS))
    def remove_replica(self, replica_id):
        self.router.remove_replica(replica_id)

    @invariant()
    def records_and_loads_are_one_set(self):
        self.router.check_invariants()
        for replica_id in REPLICAS:
            assert self.router.loads.num_outstanding(replica_id) == len(
                self.router.ledger.on_replica(replica_id)), replica_id


LedgerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30,
                                           deadline=None)
TestLedgerMachine = LedgerMachine.TestCase
