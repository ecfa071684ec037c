"""The standalone server's KV event pump over a real (simulated) engine: contiguous batches
to the sink, a failing sink costs only its batch, and stop() sends the rest and closes."""

from kv.events import BlockStored, EventBatch
from kv.hashing import block_hashes, namespace_root
from protocol.engine import EngineRequest, SamplingParams
from worker.engine.config import EngineConfig
from worker.engine.factory import build_engine
from worker.openai_server.kv_events import EventPump, EventPumpConfig


class RecordingSink:
    def __init__(self, fail_batches: int = 0):
        self.batches: list[EventBatch] = []
        self.fail_batches = fail_batches  # the first this many publishes raise
        self.closed = False

    def publish(self, batch: EventBatch) -> None:
        assert not self.closed
        if self.fail_batches:
            self.fail_batches -= 1
            raise ConnectionError("the publisher's socket is gone")
        self.batches.append(batch)

    def close(self) -> None:
        self.closed = True


def engine():
    return build_engine(EngineConfig(model="tiny", engine="sim", sim_preset="tiny",
                                     num_blocks=64, block_size=16))


async def run(eng, prompt: list[int], request_id: str) -> None:
    async for _ in eng.generate(EngineRequest(request_id, prompt, SamplingParams(max_tokens=2))):
        pass


def stored_hashes(batches: list[EventBatch]) -> list[bytes]:
    return [h for b in batches for e in b.events if isinstance(e, BlockStored)
            for h in e.block_hashes]


async def test_batches_reach_the_sink_in_sequence_and_stop_flushes_and_closes():
    eng = engine()
    sink = RecordingSink()
    pump = EventPump(eng.drain_events, sink, EventPumpConfig(interval_s=0.005))
    pump.start()
    prompt = [(i % 200) + 3 for i in range(48)]
    await run(eng, prompt, "a")
    await run(eng, prompt[:32] + [7] * 16, "b")
    await eng.shutdown()
    await pump.stop()
    assert sink.closed
    assert all(b.events for b in sink.batches)
    for before, after in zip(sink.batches, sink.batches[1:]):
        assert after.first_seq == before.next_seq
    root = namespace_root("tiny")
    expected = block_hashes(prompt, 16, root) + block_hashes(prompt[:32] + [7] * 16, 16, root)[2:]
    assert stored_hashes(sink.batches) == expected
    assert pump.num_batches_published == len(sink.batches)


async def test_a_failing_sink_loses_only_its_batch():
    eng = engine()
    sink = RecordingSink(fail_batches=1)
    pump = EventPump(eng.drain_events, sink)
    prompt = [(i % 200) + 3 for i in range(32)]
    await run(eng, prompt, "lost")
    pump.pump_once()  # this batch is lost: the consumer sees a gap and resyncs
    await run(eng, [9] * 16 + prompt[16:], "kept")
    await pump.stop()
    assert (pump.num_publish_errors, pump.num_batches_published) == (1, 1)
    root = namespace_root("tiny")
    assert stored_hashes(sink.batches) == block_hashes([9] * 16 + prompt[16:], 16, root)
    assert sink.batches[0].first_seq > 0 and sink.closed
    await eng.shutdown()


async def test_without_a_sink_the_log_is_still_drained():
    eng = engine()
    pump = EventPump(eng.drain_events, None)
    await run(eng, list(range(3, 35)), "x")
    pump.pump_once()
    assert eng.drain_events().events == ()
    await pump.stop()
    await eng.shutdown()
