"""Engine core under faults: a failed step must leave no cache entry pointing at KV that
was never written."""

from kv.events import EventLog
from kv.manager import KVCacheConfig, MatchResult
from protocol.engine import SampledToken, SamplingParams
from tests.kv.conftest import BLOCK_SIZE, ROOT, hashes
from worker.engine.core import EngineCore
from worker.engine.request import Request
from worker.engine.scheduler import SchedulerConfig

A = list(range(100, 112))  # 3 full blocks of 4
B = list(range(700, 712))


def make_core() -> EngineCore:
    return EngineCore(KVCacheConfig(num_blocks=3, block_size=BLOCK_SIZE, num_host_blocks=4),
                      SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4),
                      EventLog("r0", epoch="e0"))


def run(core: EngineCore, request_id: str, tokens: list[int], fail: bool = False):
    core.add(Request(request_id, tokens, SamplingParams(max_tokens=1), BLOCK_SIZE, ROOT))
    plan, unfit = core.plan_step()
    assert plan is not None and not unfit
    if fail:
        assert [r.request_id for r in core.fail_step(plan.step)] == [request_id]
    else:
        core.update(plan.step, {request_id: SampledToken(1)})
    core.scheduler.check_invariants()
    return plan.step.copies


def test_failed_step_drops_host_entries_its_swap_out_never_wrote():
    core = make_core()
    run(core, "a", A)
    copies = run(core, "b", B, fail=True)  # evicting A to host: the copies never ran
    assert copies.swap_out
    assert core.kv.match(hashes(A)) == MatchResult(0, 0, 0)


def test_failed_step_drops_device_entries_its_swap_in_never_filled():
    core = make_core()
    run(core, "a", A)
    run(core, "b", B)  # A goes to the host tier for real
    assert core.kv.match(hashes(A)).num_host_blocks == 3
    copies = run(core, "a2", A, fail=True)
    assert copies.swap_in
    match = core.kv.match(hashes(A))
    assert match.num_device_blocks == 0  # would be 3 garbage hits without the abort
    run(core, "a3", A)  # served again from the (valid) host copies or recomputed


async def test_prompt_that_cannot_fit_beside_the_pins_is_refused_with_the_reason():
    import pytest

    from protocol.engine import EngineInputError, EngineRequest
    from tests.worker.engine.test_engine_sim import collect, make_engine, prompt

    engine = make_engine(num_blocks=8, pin_budget_blocks=4)
    system = prompt(64)
    assert await engine.pin_prefix("sys", system) == 4
    # 7 blocks fit the pool but not the 4 unpinned ones: refused at once, not queued.
    with pytest.raises(EngineInputError, match="besides its 4 pinned blocks"):
        await collect(engine, EngineRequest("big", prompt(100, 300),
                                            SamplingParams(max_tokens=1)))
    # A prompt that starts with the pinned prefix reuses those blocks and fits.
    out = await collect(engine, EngineRequest("ok", system + prompt(40, 300),
                                              SamplingParams(max_tokens=1)))
    assert out[-1].finish_reason == "length"
    await engine.shutdown()


def test_published_load_does_not_count_a_waiting_requests_cached_prefix():
    """The replica holding the cache looked busiest to the router."""
    core = make_core()
    run(core, "a", A)  # A's 3 blocks are cached now
    core.add(Request("w", A + [1, 2, 3, 4], SamplingParams(max_tokens=1), BLOCK_SIZE, ROOT))
    core.add(Request("cold", B, SamplingParams(max_tokens=1), BLOCK_SIZE, ROOT))
    assert core.stats().num_queued_prefill_tokens == 4 + 12


async def test_an_unpin_aimed_at_another_replica_is_a_no_op():
    """An unpin for a dead replica, routed elsewhere, removed a newer pin."""
    from protocol.engine import UnpinRequest
    from router.serve.engine_replica import unpin_if_mine
    from tests.worker.engine.test_engine_sim import make_engine, prompt

    engine = make_engine(num_blocks=16, pin_budget_blocks=4)
    assert await engine.pin_prefix("t/sys", prompt(64)) == 4
    assert not unpin_if_mine(engine, "r-live", UnpinRequest("t/sys", "r-dead"))
    assert engine.core.kv.num_pinned_blocks == 4  # the newer pin is still here
    assert unpin_if_mine(engine, "r-live", UnpinRequest("t/sys", "r-live"))
    assert engine.core.kv.num_pinned_blocks == 0
    await engine.shutdown()
