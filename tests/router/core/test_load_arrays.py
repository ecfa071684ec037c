"""LoadTracker.loads: every replica's load at once equals `load` one replica at a time,
with recent work decaying, published stats, finished requests and unknown replicas."""

import random

import pytest

from protocol.engine import EngineStats
from router.core import load
from router.core.load import LoadTracker
from tests.router.core.core_helpers import FakeClock


@pytest.mark.parametrize("in_python_up_to", [load._LOADS_IN_PYTHON, 0, 1 << 20])
def test_loads_equal_load_replica_by_replica(in_python_up_to, monkeypatch):
    """A few replicas' loads are read one by one, more as arrays: as `loads` splits them,
    then every call one way, then every call the other."""
    monkeypatch.setattr(load, "_LOADS_IN_PYTHON", in_python_up_to)
    rng = random.Random(3)
    clock = FakeClock()
    tracker = LoadTracker(decode_weight=0.7, recent_half_life_s=5.0, clock=clock)
    replicas = [f"r{i}" for i in range(30)]
    for step in range(300):
        action = rng.random()
        if action < 0.5:
            tracker.add(f"q{step}", rng.choice(replicas), rng.random() * 5000, rng.randint(0, 300))
        elif action < 0.7:
            tracker.finish(f"q{rng.randrange(step + 1)}")
        elif action < 0.8:
            tracker.update_stats(rng.choice(replicas), EngineStats(
                num_queued_prefill_tokens=rng.randint(0, 9000), num_running=rng.randint(0, 8),
                num_waiting=rng.randint(0, 4), num_blocks=1, num_used_blocks=0,
                num_cached_blocks=0, num_pinned_blocks=0, num_free_blocks=1, num_host_blocks=0,
                num_host_cached_blocks=0))
        else:
            clock.advance(rng.random() * 3)
        ids = rng.sample(replicas, rng.randint(1, len(replicas))) + ["unknown"]
        assert tracker.loads(ids).tolist() == [tracker.load(r) for r in ids]


def test_loads_without_recent_work_or_stats_are_the_outstanding_work():
    tracker = LoadTracker(clock=FakeClock())
    tracker.add("q", "a", 100.0, 10)
    assert tracker.loads(["a", "b"]).tolist() == [100.0, 0.0]
