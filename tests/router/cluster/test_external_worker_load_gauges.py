"""Queue gauges from lying workers (real HTTP servers): a NaN, infinite, negative or huge
gauge is that worker's rejected sample, never its load, and never stops the other
workers' scraping."""

import asyncio
import logging

import pytest

from router.cluster.external_worker_probe import GaugeError, queue_stats_from_metrics
from router.cluster.external_worker_set import WorkerSet, WorkerSetConfig
from router.cluster.external_worker_spec import WorkerSpec
from tests.router.lying_worker import LyingWorker, gauges


class NoIndex:
    async def follow(self, spec): pass
    async def forget(self, worker_id): pass
    async def refollow_if_restarted(self, up): pass


@pytest.mark.parametrize("running", ["NaN", "+Inf", "-Inf", "-3", "1e300"])
def test_a_gauge_that_is_not_a_queue_length_is_refused(running):
    with pytest.raises(GaugeError, match="vllm:num_requests_running"):
        queue_stats_from_metrics(gauges(running, "0"))


def test_honest_gauges_are_the_stats():
    stats = queue_stats_from_metrics(gauges("3", "4"))
    assert (stats.num_running, stats.num_waiting) == (3, 4)


@pytest.fixture
async def liar_and_honest():
    liar, honest = await LyingWorker().start(), await LyingWorker().start()
    liar.metrics_text, honest.metrics_text = gauges("NaN", "0"), gauges("2", "5")
    workers = WorkerSet(WorkerSetConfig(
        model="tiny", workers=(WorkerSpec(liar.url), WorkerSpec(honest.url)),
        health_period_s=3600.0, load_period_s=0.01), index=NoIndex())
    yield workers, liar, honest
    await workers.aclose()
    await liar.stop()
    await honest.stop()


def by_url(view):
    return {w.spec.url: w for w in view.workers}


async def test_one_workers_nan_gauge_leaves_the_others_load_scraped(liar_and_honest, caplog):
    workers, liar, honest = liar_and_honest
    caplog.set_level(logging.WARNING, "router.cluster.external_worker_set")
    view = await workers.poll(-1)  # starts the health and load loops
    seen: list[tuple] = []
    # The load loop keeps running: the honest worker's gauges change and are followed.
    for running in ("7", "8", "9"):
        honest.metrics_text = gauges(running, "5")
        async with asyncio.timeout(20):  # a dead load loop never updates it
            while True:
                view = await workers.poll(view.version, wait_s=1.0)
                status = by_url(view)[honest.url]
                if status.stats is not None and status.stats.num_running == int(running):
                    break
        seen.append((status.stats.num_running, status.stats.num_waiting))
    assert seen == [(7, 5), (8, 5), (9, 5)]
    lying = by_url(view)[liar.url]
    assert lying.state == "up" and lying.stats is None
    assert lying.num_rejected_load_samples >= 3
    assert by_url(view)[honest.url].num_rejected_load_samples == 0
    warnings = [r for r in caplog.records if "queue gauges rejected" in r.getMessage()]
    assert len(warnings) == 1 and liar.url in warnings[0].getMessage()
