"""Miss causes of a request whose engine did not say what it found cached (the gateway
ingress's Serve calls, a worker that reports no cached tokens): the three causes the
decision knew, of the tokens it predicted uncached, and no race."""

from router.core.miss_causes import MissTokens
from tests.router.core.test_core import prompt, snapshot
from tests.router.core.test_miss_causes import make_router


def test_without_a_delivered_count_the_decision_causes_are_counted_and_no_race():
    router = make_router(policy="round_robin")
    snapshot(router, "r0", device=prompt(0, 1, 2))
    router.route("q1", prompt(0, 1, 2, 3), 70, ["r0", "r1"])  # r0: 48 predicted
    causes = router.on_finished("q1", count_misses=True)
    # block 3 and the 6 tokens past it never seen; the predicted 48 taken as delivered
    assert causes == MissTokens(cold=22)
    router.route("q2", prompt(0, 1, 2, 3), 70, ["r0", "r1"])  # r1: nothing predicted
    # r0 holds 3 blocks and has q1's 4th pending: placement; the partial block cold
    assert router.on_finished("q2", count_misses=True) == MissTokens(placement=64, cold=6)
    assert router.misses.totals == MissTokens(placement=64, cold=28)
    assert router.misses.num_outstanding() == 0


def test_a_fully_predicted_prompt_still_misses_its_last_token():
    router = make_router()
    snapshot(router, "r0", device=prompt(0, 1))
    router.route("q1", prompt(0, 1), 32, ["r0", "r1"])  # all 32 predicted cached on r0
    assert router.on_finished("q1", count_misses=True) == MissTokens(cold=1)


def test_a_delivered_count_wins_and_without_either_nothing_is_counted():
    router = make_router()
    snapshot(router, "r1", device=prompt(0, 1, 2, 3))
    router.route("q1", prompt(0, 1, 2, 3, 4), 90, ["r0", "r1"])
    assert router.on_finished("q1", 32, count_misses=True) == MissTokens(race=32, cold=26)
    router.route("q2", prompt(0, 1, 2, 3, 4), 90, ["r0", "r1"])
    assert router.on_finished("q2") is None
    assert router.misses.num_outstanding() == 0
