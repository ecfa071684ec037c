"""The gateway ladder's contenders: which runs stand beside one gateway."""

from benchmarks.simlib.gateway_ladder import gateway_contenders
from router.core.config import RouterConfig


def labels(**kw) -> list[str]:
    return [c.label for c in gateway_contenders("cache_aware", RouterConfig(), [1, 2, 8],
                                                ["round_robin", "session"], 0.005, **kw)]


def test_shared_only_keeps_one_gateway_round_robin_and_the_largest_sharing_the_most():
    assert labels(share_work=True, rotate=True) == [
        "cache_aware", "round_robin", "cache_aware@2gw/rot", "cache_aware@2gw/session/rot",
        "cache_aware@8gw/rot", "cache_aware@8gw/session/rot", "cache_aware@8gw/rot+marks",
        "cache_aware@8gw/session/rot+marks", "cache_aware@8gw/rot+marks+work",
        "cache_aware@8gw/session/rot+marks+work"]
    assert labels(share_work=True, rotate=True, shared_only=True) == [
        "cache_aware", "round_robin", "cache_aware@8gw/rot+marks+work",
        "cache_aware@8gw/session/rot+marks+work"]
    assert labels(shared_only=True) == [  # without routed work shared: the marks
        "cache_aware", "round_robin", "cache_aware@8gw+marks", "cache_aware@8gw/session+marks"]
