"""The worker set (its plain class, no Ray) against a real `kvroute engine` worker: health
checks, the model check, runtime add and remove, drains, queue gauges."""

import pytest

from benchmarks.simlib.engine_workers import SIM_TINY_ARGS, EngineWorker
from router.cluster.external_worker_set import WorkerSet, WorkerSetConfig
from router.cluster.external_worker_spec import WorkerSpec

pytestmark = pytest.mark.slow

DEAD = WorkerSpec("http://127.0.0.1:1")  # nothing listens on port 1


@pytest.fixture(scope="module")
def worker():
    w = EngineWorker.start(SIM_TINY_ARGS)
    yield w
    w.stop()


class Followed:
    """Records what the worker set tells the index (the IndexLink contract)."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    async def follow(self, spec: WorkerSpec) -> None:
        self.calls.append(("follow", spec.worker_id))

    async def forget(self, worker_id: str) -> None:
        self.calls.append(("forget", worker_id))

    async def refollow_if_restarted(self, up) -> None:
        pass


@pytest.fixture
async def make_set():
    """WorkerSet(specs, model) factory; each one's checks stop with the test."""
    made: list[WorkerSet] = []

    def make(*specs: WorkerSpec, model: str = "tiny") -> tuple[WorkerSet, Followed]:
        index = Followed()
        config = WorkerSetConfig(model=model, workers=specs, health_period_s=3600.0,
                                 load_period_s=0.0)  # the tests run the passes themselves
        made.append(WorkerSet(config, index=index))
        return made[-1], index

    yield make
    for workers in made:
        await workers.aclose()


def states(view) -> dict[str, tuple[str, str | None]]:
    return {w.spec.worker_id: (w.state, w.error) for w in view.workers}


async def test_the_first_poll_waits_for_the_first_health_pass(worker, make_set):
    spec = WorkerSpec.parse(worker.url)
    workers, index = make_set(spec, DEAD)
    view = await workers.poll(-1)
    found = states(view)
    assert found[spec.worker_id] == ("up", None)
    state, error = found[DEAD.worker_id]
    assert state == "down" and error.startswith("worker http://127.0.0.1:1 is unreachable")
    assert [w.spec for w in view.up()] == [spec]
    # the index follows what is up (if it has events) and drops what is down
    assert index.calls == [("follow", spec.worker_id), ("forget", DEAD.worker_id)]
    assert (await workers.poll(view.version, wait_s=0.2)).version == view.version


async def test_runtime_add_checks_the_worker_and_remove_drops_its_index(worker, make_set):
    spec = WorkerSpec.parse(worker.url)
    workers, index = make_set()
    await workers.poll(-1)
    change = await workers.add(DEAD)
    assert change.outcome == "unusable" and "is unreachable" in change.error
    added = await workers.add(spec)
    assert added.outcome == "added" and added.status.state == "up"
    assert (await workers.add(spec)).outcome == "exists"
    assert [w.spec for w in (await workers.poll(-1)).up()] == [spec]
    removed = await workers.remove(spec.worker_id)
    assert removed.outcome == "removed"
    assert index.calls == [("follow", spec.worker_id), ("forget", spec.worker_id)]
    assert (await workers.remove(spec.worker_id)).outcome == "unknown"
    assert (await workers.poll(-1)).workers == ()


async def test_a_worker_serving_another_model_is_refused(worker, make_set):
    workers, _ = make_set(model="llama-3")
    await workers.poll(-1)
    change = await workers.add(WorkerSpec.parse(worker.url))
    assert change.outcome == "unusable"
    assert "does not serve the model 'llama-3' (it serves ['tiny'])" in change.error


async def test_queue_gauges_become_the_workers_stats(worker, make_set):
    spec = WorkerSpec.parse(worker.url)
    workers, _ = make_set(spec)
    await workers.poll(-1)
    await workers.scrape_all()
    (status,) = (await workers.poll(-1)).workers
    assert status.stats is not None
    assert (status.stats.num_running, status.stats.num_waiting) == (0, 0)


async def test_a_killed_worker_is_drained_when_a_gateway_reports_it(make_set):
    victim = EngineWorker.start(SIM_TINY_ARGS)
    spec = WorkerSpec.parse(victim.url)
    workers, index = make_set(spec)
    try:
        assert [w.spec for w in (await workers.poll(-1)).up()] == [spec]
        victim.kill()
        await workers.report_failure(spec.worker_id, "connection refused")
        (status,) = (await workers.poll(-1)).workers
        assert status.state == "down" and "is unreachable" in status.error
        assert index.calls == [("follow", spec.worker_id), ("forget", spec.worker_id)]
        await workers.check_all()  # still down: nothing changes, nothing dropped again
        assert index.calls == [("follow", spec.worker_id), ("forget", spec.worker_id)]
    finally:
        victim.kill()
