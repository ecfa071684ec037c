"""The front's latency histograms (worker/openai/latency.py), on a clock the test sets."""

from prometheus_client import CollectorRegistry

from protocol.engine import TokenDelta, Usage
from worker.openai.latency import ARRIVAL_KEY, LatencyMetrics, arrival_of, mark_arrival, relayed


class Clock:
    def __init__(self, now_s: float):
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def observed(registry: CollectorRegistry, name: str) -> tuple[float, float]:
    """(count, sum) of the histogram `name` for model "m"."""
    labels = {"model": "m"}
    return (registry.get_sample_value(f"{name}_count", labels),
            registry.get_sample_value(f"{name}_sum", labels))


async def deltas_at(clock: Clock, steps: list[tuple[float, TokenDelta]]):
    for now_s, delta in steps:
        clock.now_s = now_s
        yield delta


def test_every_histogram_exists_at_zero_from_the_start():
    registry = CollectorRegistry()
    LatencyMetrics(registry, "m")
    for name in ("preprocess", "queue", "ttft", "tpot", "e2e"):
        assert observed(registry, f"kvroute_gateway_{name}_seconds") == (0.0, 0.0)


async def test_a_request_is_timed_from_its_arrival():
    registry, clock = CollectorRegistry(), Clock(100.0)
    metrics = LatencyMetrics(registry, "m", clock)
    timer = metrics.timer(arrival_s=100.0)
    clock.now_s = 100.25  # parsed, tokenized and hashed
    timer.dispatched()
    usage = Usage(4, 5, 0, 0)
    # first token 1.0 s after arrival, 0.125 s of which the engine spent computing it; two
    # tokens merged into the second delta; the last of 5 tokens at 3.0 s
    steps = [(101.0, TokenDelta("r", [1], "a", first_token_compute_s=0.125)),
             (102.0, TokenDelta("r", [2, 3], "bc")),
             (103.0, TokenDelta("r", [4, 5], "de", "length", usage))]
    got = [d async for d in timer.watch(deltas_at(clock, steps))]
    assert got == [d for _, d in steps]
    assert observed(registry, "kvroute_gateway_preprocess_seconds") == (1, 0.25)
    assert observed(registry, "kvroute_gateway_ttft_seconds") == (1, 1.0)
    assert observed(registry, "kvroute_gateway_queue_seconds") == (1, 0.875)
    assert observed(registry, "kvroute_gateway_e2e_seconds") == (1, 3.0)
    assert observed(registry, "kvroute_gateway_tpot_seconds") == (1, 0.5)  # 2 s / 4 tokens


async def test_a_retried_request_counts_its_first_token_once_and_a_failure_no_latency():
    registry, clock = CollectorRegistry(), Clock(0.0)
    timer = LatencyMetrics(registry, "m", clock).timer(arrival_s=0.0)
    lost = [(1.0, TokenDelta("r", [1], "a", first_token_compute_s=0.5))]
    assert len([d async for d in timer.watch(deltas_at(clock, lost))]) == 1
    failed = [(2.0, TokenDelta("r~r1", [7], "x", first_token_compute_s=0.5)),
              (3.0, TokenDelta("r~r1", [], "", "error", error="boom"))]
    assert len([d async for d in timer.watch(deltas_at(clock, failed))]) == 2
    assert observed(registry, "kvroute_gateway_ttft_seconds") == (1, 1.0)
    assert observed(registry, "kvroute_gateway_queue_seconds") == (1, 0.5)
    assert observed(registry, "kvroute_gateway_e2e_seconds") == (0, 0.0)
    assert observed(registry, "kvroute_gateway_tpot_seconds") == (0, 0.0)


async def test_closing_the_watched_stream_closes_the_engine_stream():
    closed = []

    async def engine():
        try:
            yield TokenDelta("r", [1], "a")
            yield TokenDelta("r", [2], "b")
        finally:
            closed.append(True)

    registry = CollectorRegistry()
    watched = LatencyMetrics(registry, "m").timer(0.0).watch(engine())
    assert (await anext(watched)).token_ids == [1]
    await watched.aclose()
    assert closed == [True]
    assert observed(registry, "kvroute_gateway_e2e_seconds")[0] == 0  # the client left


async def test_a_relayed_stream_is_timed_by_its_events():
    registry, clock = CollectorRegistry(), Clock(10.0)
    metrics = LatencyMetrics(registry, "m", clock)
    released = []

    async def worker():
        try:
            clock.now_s = 10.5
            yield b'data: {"x":1}\n\n'
            clock.now_s = 11.0
            yield b'data: {"x":2}\n\ndata: {"x":3}\n\n'
            clock.now_s = 12.5
            yield b"data: [DONE]\n\n"
        finally:
            released.append(True)

    chunks = [c async for c in relayed(metrics, 10.0, worker())]
    assert len(chunks) == 3 and released == [True]
    assert observed(registry, "kvroute_gateway_ttft_seconds") == (1, 0.5)
    assert observed(registry, "kvroute_gateway_e2e_seconds") == (1, 2.5)
    assert observed(registry, "kvroute_gateway_tpot_seconds") == (1, 1.0)  # 2 s / 2 events
    assert observed(registry, "kvroute_gateway_queue_seconds") == (0, 0.0)


def test_the_arrival_stamp_is_the_first_one():
    scope = {}
    mark_arrival(scope)
    first = scope[ARRIVAL_KEY]
    mark_arrival(scope)
    assert arrival_of(scope) == first
