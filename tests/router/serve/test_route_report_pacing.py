"""A replica's route reports, paced: a lone end leaves at once; a busy replica's ends wait
for the gap after the last call that carried reports (`min_report_gap_s`) and go together,
one call in flight; they ride a publish when one is due (a publish interval since the
last), else go alone (`report_routes`). The clock and the gap's sleep are faked: each
sleep parks until the test lets it end."""

import asyncio
from types import SimpleNamespace

from router.cluster.route_ends import end_of
from router.serve.publisher import PublisherConfig, ReplicaPublisher
from router.serve.route_header import Route
from router.serve.route_tracking import RouteReports

GAP_S = 0.01


class FakeTime:
    def __init__(self) -> None:
        self.now_s = 100.0
        self.sleeps_s: list[float] = []  # each sleep asked for
        self._wake: asyncio.Future | None = None

    def clock(self) -> float:
        return self.now_s

    async def sleep(self, seconds: float) -> None:
        self.sleeps_s.append(round(seconds, 9))
        self._wake = asyncio.get_running_loop().create_future()
        await self._wake

    def end_sleep(self, now_s: float) -> None:
        self.now_s = now_s
        self._wake.set_result(None)


# an engine with nothing new: each publish carries only the reports
ENGINE = SimpleNamespace(drain_events=lambda: SimpleNamespace(events=()), stats=lambda: None)


class GatedIndex:
    """Records the reports each `publish` or `report_routes` call carries, and which it was;
    a call returns (a publish asking no snapshot) when the test opens its gate."""

    def __init__(self) -> None:
        self.reports: list[dict[str, tuple[str, ...]]] = []
        self.kinds: list[str] = []
        self.gate: asyncio.Future | None = None
        self.publish = SimpleNamespace(remote=self._publish)
        self.report_routes = SimpleNamespace(remote=self._report_routes)
        self._called = asyncio.Event()

    async def next_call(self) -> None:
        """Returns once a call came since the last `next_call` (the handle is found again on
        a thread after a failure: more than a few turns of the loop)."""
        await self._called.wait()
        self._called.clear()

    async def _publish(self, batch, stats, reports) -> bool:
        await self._call("publish", reports)
        return False

    async def _report_routes(self, reports, replica_id) -> None:
        assert replica_id == "replica-a"
        await self._call("report_routes", reports)

    async def _call(self, kind: str, reports) -> None:
        self.kinds.append(kind)
        self.reports.append(reports)
        self._called.set()
        self.gate = asyncio.get_running_loop().create_future()
        await self.gate


async def _settle() -> None:
    """Lets every ready task run until it waits (on a gate or a faked sleep)."""
    for _ in range(10):
        await asyncio.sleep(0)


def _started() -> tuple[FakeTime, GatedIndex, RouteReports, ReplicaPublisher]:
    """A started publisher on the faked clock (no Ray here: the periodic publish loop ends
    at once), reporting to a gated index."""
    fake, index = FakeTime(), GatedIndex()
    reports = RouteReports(clock=lambda: 7.0)
    publisher = ReplicaPublisher(ENGINE, lambda: index,
                                 PublisherConfig(min_report_gap_s=GAP_S), reports,
                                 "replica-a", clock=fake.clock, sleep=fake.sleep)
    publisher.start()
    return fake, index, reports, publisher


def _end(reports: RouteReports, route_id: str) -> str:
    reports.end(Route("router-1", route_id), cached_tokens=0, output_tokens=4)
    return end_of(route_id, 0, 4, 7.0)


async def test_a_busy_replicas_ends_wait_for_the_gap_and_go_together():
    fake, index, reports, publisher = _started()
    first = _end(reports, "q1")  # a quiet replica: it leaves at once
    await index.next_call()
    assert index.reports == [{"router-1": (first,)}] and fake.sleeps_s == []
    second = _end(reports, "q2")  # while the first call is in flight
    fake.now_s = 100.003
    index.gate.set_result(None)  # the first call returns 3 ms after it started
    await _settle()
    assert len(index.reports) == 1 and fake.sleeps_s == [0.007]  # the gap's rest
    third = _end(reports, "q3")  # during the gap: waits with the second
    fake.end_sleep(100.010)
    await _settle()
    assert index.reports[1:] == [{"router-1": (second, third)}]
    assert index.kinds == ["publish", "report_routes"]  # 10 ms after the publish: alone
    fake.now_s = 100.012
    index.gate.set_result(None)
    await _settle()
    assert fake.sleeps_s == [0.007, 0.008]  # a gap after the second call, nothing queued
    fake.end_sleep(100.020)
    await _settle()
    assert len(index.reports) == 2
    await publisher.drain_reports()  # the reporting task ended
    fake.now_s = 101.0  # quiet again: the next end leaves at once, with a publish due
    fourth = _end(reports, "q4")
    await _settle()
    assert index.reports[2:] == [{"router-1": (fourth,)}] and len(fake.sleeps_s) == 2
    assert index.kinds[2:] == ["publish"]
    index.gate.set_result(None)
    await _settle()
    fake.end_sleep(101.010)
    await publisher.drain_reports()


async def test_a_failed_report_is_sent_again_after_the_gap():
    fake, index, reports, publisher = _started()
    first = _end(reports, "q1")
    await index.next_call()
    index.gate.set_exception(ConnectionError("actor away"))
    await _settle()
    await publisher.drain_reports()  # failed: queued again, no retry loop
    assert reports.take() == {"router-1": (first,)}
    reports.put_back({"router-1": (first,)})
    second = _end(reports, "q2")  # the next end: after the gap from the failed call
    await _settle()
    assert fake.sleeps_s == [GAP_S] and len(index.reports) == 1
    fake.end_sleep(100.010)
    await index.next_call()
    assert index.reports[1:] == [{"router-1": (first, second)}]
    index.gate.set_result(None)
    await _settle()
    fake.end_sleep(100.020)
    await publisher.drain_reports()


async def test_after_its_goodbye_a_replicas_last_ends_go_alone():
    """A publish would make the actor know the replica again after it forgot it."""
    fake, index, reports, publisher = _started()
    index.forget_replica = SimpleNamespace(remote=lambda replica_id: asyncio.sleep(0))
    first = _end(reports, "q1")  # a publish is due: it rides one
    await index.next_call()
    second = _end(reports, "q2")  # while that call is in flight
    stopping = asyncio.ensure_future(publisher.stop("replica-a"))  # waits for the drain
    await _settle()
    fake.now_s = 101.0  # a publish would be due again, and the gap has passed
    index.gate.set_result(None)
    await index.next_call()
    assert index.kinds == ["publish", "report_routes"]
    assert index.reports == [{"router-1": (first,)}, {"router-1": (second,)}]
    index.gate.set_result(None)
    await _settle()
    fake.end_sleep(101.020)
    await stopping
