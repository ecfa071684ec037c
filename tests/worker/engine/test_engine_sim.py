"""The engine loop over the simulated executor: streaming, usage, abort, pins, events."""

import asyncio

import pytest

from kv.events import ReplicaSets
from kv.hashing import block_hashes, namespace_root
from protocol.engine import (
    EngineInputError,
    EngineRequest,
    EngineUnavailableError,
    EngineUnhealthyError,
    PinnedPrefix,
    SamplingParams,
)
from worker.engine.config import EngineConfig
from worker.engine.engine import STEP_FAILED
from worker.engine.factory import build_engine


def make_engine(**kw):
    cfg = dict(model="tiny", engine="sim", sim_preset="tiny", num_blocks=64, block_size=16)
    cfg.update(kw)
    return build_engine(EngineConfig(**cfg))


async def collect(engine, request):
    return [d async for d in engine.generate(request)]


def prompt(n, start=1):
    return [(start + i) % 250 + 3 for i in range(n)]


async def test_stream_then_usage_with_cached_tokens_on_the_second_request():
    engine = make_engine()
    p = prompt(70)
    first = await collect(engine, EngineRequest("a", p, SamplingParams(max_tokens=5)))
    assert [len(d.token_ids) for d in first] == [1] * 5
    assert first[-1].finish_reason == "length"
    assert first[-1].usage.prompt_tokens == 70 and first[-1].usage.cached_tokens == 0
    second = await collect(engine, EngineRequest("b", p + [9], SamplingParams(max_tokens=2)))
    assert second[-1].usage.cached_tokens_device == 64  # 4 full blocks of 16
    m = engine.metrics
    assert m.series(m.hit_tokens, medium="device")._value.get() == 64
    assert m.series(m.query_tokens)._value.get() == 141
    await engine.shutdown()


async def test_only_the_first_delta_reports_the_engine_compute_of_the_first_token():
    engine = make_engine()
    out = await collect(engine, EngineRequest("t", prompt(40), SamplingParams(max_tokens=4)))
    assert out[0].first_token_compute_s is not None and out[0].first_token_compute_s >= 0
    assert [d.first_token_compute_s for d in out[1:]] == [None] * (len(out) - 1)
    await engine.shutdown()


async def test_gateway_hashes_must_match_block_count():
    engine = make_engine()
    p = prompt(40)
    good = block_hashes(p, 16, namespace_root("tiny"))
    out = await collect(engine, EngineRequest("ok", p, SamplingParams(max_tokens=1),
                                              block_hashes=good))
    assert out[-1].finish_reason == "length"
    with pytest.raises(EngineInputError, match="full blocks"):
        await collect(engine, EngineRequest("bad", p, block_hashes=good[:1]))
    await engine.shutdown()


@pytest.mark.parametrize("request_, message", [
    (EngineRequest("e", []), "empty"),
    (EngineRequest("long", prompt(2048)), "context"),
    (EngineRequest("vocab", [10**6]), "token ids"),
])
async def test_bad_input_is_a_clear_error_and_the_engine_keeps_serving(request_, message):
    engine = make_engine(max_model_len=1024)
    with pytest.raises(EngineInputError, match=message):
        await collect(engine, request_)
    out = await collect(engine, EngineRequest("after", prompt(5), SamplingParams(max_tokens=2)))
    assert out[-1].finish_reason == "length"
    await engine.shutdown()


async def test_closing_the_stream_aborts_and_frees_blocks():
    engine = make_engine()
    stream = engine.generate(EngineRequest("x", prompt(40), SamplingParams(max_tokens=500)))
    await stream.__anext__()
    await stream.aclose()
    assert "x" not in engine.core.scheduler.requests
    assert engine.stats().num_used_blocks == 0
    await engine.shutdown()


async def test_events_rebuild_the_engine_cache_contents():
    engine = make_engine(num_blocks=8)
    sets = ReplicaSets()
    tracker = sets.tracker
    tracker.apply_snapshot(engine.snapshot())
    await asyncio.gather(*(collect(engine, EngineRequest(f"r{i}", prompt(50, i * 7),
                                                         SamplingParams(max_tokens=3)))
                           for i in range(5)))
    assert not tracker.apply_batch(engine.drain_events()).needs_snapshot
    assert sets.contents["device"] == set(engine.core.kv.pool.cached)
    assert engine.core.kv.pool.num_evictions > 0
    await engine.shutdown()


async def test_pinned_prefix_survives_pressure():
    engine = make_engine(num_blocks=8, pin_budget_blocks=2)
    system = prompt(32, 100)
    assert await engine.pin_prefix("sys", system) == 2
    for i in range(4):  # fill the pool many times over
        await collect(engine, EngineRequest(f"f{i}", prompt(90, i * 13),
                                            SamplingParams(max_tokens=2)))
    out = await collect(engine, EngineRequest("s", system + [5], SamplingParams(max_tokens=1)))
    assert out[-1].usage.cached_tokens == 32
    with pytest.raises(EngineInputError, match="pin budget"):
        await engine.pin_prefix("big", prompt(64, 200))
    # what it reports to the index actor (a restarted one rebuilds its records from it):
    # the pin that fits, not the one refused
    assert engine.pinned_prefixes() == (PinnedPrefix("sys", "", tuple(system), 2),)
    m = engine.metrics
    assert m.series(m.kv_blocks, state="pinned")._value.get() == 2
    assert engine.unpin_prefix("sys") and not engine.unpin_prefix("sys")
    assert engine.pinned_prefixes() == ()
    assert m.series(m.kv_blocks, state="pinned")._value.get() == 0  # at once, not after a step
    await engine.shutdown()


async def test_stop_strings_cut_the_text():
    engine = make_engine()
    # The sim's tokens depend on (request id, position) only: the same id repeats its text.
    out = await collect(engine, EngineRequest("s", prompt(8), SamplingParams(max_tokens=30)))
    text = "".join(d.text for d in out)
    stop = text[5:7]
    assert len(stop) == 2 and text.index(stop) == 5
    cut = await collect(engine, EngineRequest("s", prompt(8), SamplingParams(
        max_tokens=30, stop=(stop,))))
    assert "".join(d.text for d in cut) == text[:5]
    assert cut[-1].finish_reason == "stop"
    await engine.shutdown()


def test_unknown_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        make_engine(model=str(tmp_path / "does-not-exist"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        make_engine(model=str(tmp_path / "empty"))


async def test_a_closed_engine_refuses_new_requests_as_unavailable_not_as_bad_input():
    engine = make_engine()
    await engine.shutdown()
    with pytest.raises(EngineUnavailableError, match="shutting down") as info:
        await collect(engine, EngineRequest("late", prompt(5), SamplingParams(max_tokens=2)))
    assert not isinstance(info.value, EngineInputError)  # the gateway retries it elsewhere


class _FailingSteps:
    """The engine's executor with its next `n` steps failing (a fault the simulated
    executor cannot have by itself, like a lost TP rank)."""

    def __init__(self, executor, n):
        self._executor, self.n = executor, n

    def __getattr__(self, name):
        return getattr(self._executor, name)

    def execute(self, step, sampling):
        if self.n:
            self.n -= 1
            raise RuntimeError("rank 1 is gone")
        return self._executor.execute(step, sampling)


async def test_health_check_fails_after_consecutive_failed_steps_and_recovers_after_one_ok():
    engine = make_engine()
    engine.executor = faulty = _FailingSteps(engine.executor, 3)
    for i in range(2):
        out = await collect(engine, EngineRequest(f"f{i}", prompt(5), SamplingParams(max_tokens=2)))
        assert (out[-1].finish_reason, out[-1].error) == ("error", STEP_FAILED)
        engine.check_health()  # one or two failed steps: their requests fail, nothing else
    out = await collect(engine, EngineRequest("f2", prompt(5), SamplingParams(max_tokens=2)))
    assert out[-1].finish_reason == "error"
    with pytest.raises(EngineUnhealthyError, match=r"^the last 3 engine steps failed \(the "):
        engine.check_health()
    assert faulty.n == 0
    out = await collect(engine, EngineRequest("ok", prompt(5), SamplingParams(max_tokens=2)))
    assert out[-1].finish_reason == "length"
    engine.check_health()
    await engine.shutdown()


async def test_a_finished_sequence_is_told_with_its_generated_blocks_hashes():
    engine = make_engine()
    told = []
    engine.on_finished = told.append
    out = await collect(engine, EngineRequest("f", prompt(30), SamplingParams(max_tokens=10)))
    tokens = prompt(30) + [t for d in out for t in d.token_ids]  # 40 tokens: 2 full blocks
    assert told == [block_hashes(tokens, 16, namespace_root("tiny"))]
    await engine.shutdown()
