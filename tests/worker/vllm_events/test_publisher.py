"""A kvroute engine's KV events published in vLLM's format over real ZMQ sockets."""

import zmq

from kv.events import BlockRemoved, BlockStored, EventBatch, Snapshot
from kv.hashing import block_hashes, namespace_root
from protocol.engine import EngineRequest, SamplingParams
from protocol.vllm import frames, wire
from router.core.engine_hash_map import EngineHashConfig, EngineHashMap
from worker.engine.config import EngineConfig
from worker.engine.factory import build_engine
from worker.vllm_events.publisher import VllmEventPublisher, VllmPublisherConfig
from worker.vllm_events.translate import VllmEventTranslator

B = 16


def replay(publisher, start_seq: int) -> list[frames.EventFrame]:
    """Everything the publisher's replay socket answers for `start_seq`."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(publisher.replay_endpoint)
    try:
        dealer.send_multipart(frames.replay_request(start_seq))
        out = []
        while dealer.poll(10_000):
            frame = frames.parse_replay_frames(dealer.recv_multipart())
            if frame is None:
                return out
            out.append(frame)
        raise TimeoutError("no end marker from the replay socket")
    finally:
        dealer.close(linger=0)


def events_of(frame_list) -> list:
    return [e for f in frame_list for e in wire.decode_batch(f.payload).batch.events]


def prompt(n, start):
    return [(start + 7 * i) % 250 + 3 for i in range(n)]


async def test_the_stream_maps_back_to_the_engines_own_hashes():
    """Live events from a real (simulated) engine, with LoRA adapters, salts and a host tier
    it evicts into, rebuild exactly the engine's contents once mapped to router hashes."""
    engine = build_engine(EngineConfig(model="tiny", engine="sim", sim_preset="tiny",
                                       num_blocks=24, num_host_blocks=10, block_size=B))
    engine.core.event_log.with_token_ids = True
    publisher = VllmEventPublisher(VllmPublisherConfig(topic="kv"), engine.model_name, B)
    shared = prompt(3 * B, 1)
    requests = [(shared + prompt(2 * B + 3, 100 + i), adapter, salt)
                for i in range(6) for adapter, salt in (("", ""), ("sql-lora", ""),
                                                        ("", "tenant-a"))]
    for i, (tokens, adapter, salt) in enumerate(requests):
        request = EngineRequest(f"r{i}", tokens, SamplingParams(max_tokens=2),
                                adapter=adapter, cache_salt=salt)
        async for _ in engine.generate(request):
            pass
        publisher.publish_from(engine)
    snap = engine.snapshot()
    assert snap.host_hashes, "the test means to evict into the host tier"
    truth = {"device": set(snap.device_hashes), "host": set(snap.host_hashes)}

    assert publisher.flush()
    live = replay(publisher, 0)
    assert [f.seq for f in live] == list(range(len(live)))
    assert {f.topic for f in live} == {b"kv"}
    mapped = EngineHashMap(EngineHashConfig(engine.model_name, router_block_size=B))
    for event in events_of(live):
        mapped.apply(event)
    assert mapped.contents() == truth
    assert mapped.stats.num_unmapped_blocks == 0 and publisher.num_unpublished_blocks == 0

    snapshot_frames = replay(publisher, frames.SNAPSHOT_SEQ)
    assert [f.seq for f in snapshot_frames] == [live[-1].seq]  # valid after the last batch
    fresh = EngineHashMap(EngineHashConfig(engine.model_name, router_block_size=B))
    for event in events_of(snapshot_frames):
        fresh.apply(event)
    assert fresh.contents() == truth
    publisher.close()
    await engine.shutdown()


def test_replay_serves_the_last_buffer_steps_batches():
    publisher = VllmEventPublisher(VllmPublisherConfig(buffer_steps=3, heartbeat_s=3600), "m", 4)
    root = namespace_root("m")
    hashes = block_hashes(list(range(20)), 4, root)
    for i, h in enumerate(hashes):
        stored = BlockStored((h,), hashes[i - 1] if i else None, "device",
                             tuple(range(4 * i, 4 * i + 4)))
        assert not publisher.publish(EventBatch("r", "e", i, (stored,)), [("", "")])
    assert publisher.flush()  # seq 0 is the start heartbeat; the five stores are 1..5
    # 1 and 2 fell out of the buffer: the subscriber sees the gap
    assert [f.seq for f in replay(publisher, 1)] == [3, 4, 5]
    assert [e.block_hashes for e in events_of(replay(publisher, 5))] == [[hashes[4]]]
    assert replay(publisher, 6) == []
    publisher.close()


def test_a_gap_in_the_engine_log_republishes_its_snapshot():
    publisher = VllmEventPublisher(VllmPublisherConfig(heartbeat_s=3600), "m", 4)
    root = namespace_root("m")
    h = block_hashes(list(range(12)), 4, root)
    assert not publisher.publish(EventBatch("r", "e", 0, (
        BlockStored(tuple(h), None, "device", tuple(range(12))),)), [("", "")])
    lost = EventBatch("r", "e", 5, (BlockRemoved((h[2],), "device"),))
    assert publisher.publish(lost)  # seqs 1..4 never arrived
    assert publisher.publish(EventBatch("r", "other-epoch", 0, ()))
    publisher.publish_snapshot(Snapshot("r", "e", 6, frozenset(h[:2]), frozenset([b"?" * 16])))
    assert not publisher.publish(EventBatch("r", "e", 6, ()))
    assert publisher.flush()
    assert events_of(replay(publisher, 1)) == [
        wire.BlockStored(block_hashes=list(h), parent_block_hash=None,
                         token_ids=list(range(12)), block_size=4, lora_id=None,
                         medium="GPU", lora_name=None),
        wire.AllBlocksCleared(),
        wire.BlockStored(block_hashes=[h[0]], parent_block_hash=None, token_ids=[0, 1, 2, 3],
                         block_size=4, lora_id=None, medium="GPU", lora_name=None),
        wire.BlockStored(block_hashes=[h[1]], parent_block_hash=h[0],
                         token_ids=[4, 5, 6, 7], block_size=4, lora_id=None, medium="GPU",
                         lora_name=None)]
    assert publisher.num_unpublished_blocks == 1  # the snapshot's unknown host block
    publisher.close()


def test_heartbeats_keep_the_stream_alive_and_bad_replay_requests_are_ignored():
    publisher = VllmEventPublisher(VllmPublisherConfig(heartbeat_s=0.02), "m", 4)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.endpoint)
    seqs = []
    while len(seqs) < 3 and sub.poll(10_000):
        frame = frames.parse_pub_frames(sub.recv_multipart())
        assert wire.decode_batch(frame.payload).batch.events == []
        seqs.append(frame.seq)
    assert len(seqs) == 3 and seqs == sorted(seqs) and len(set(seqs)) == 3
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(publisher.replay_endpoint)
    dealer.send_multipart([b"", b"\x01"])  # a 1-byte seq: ignored
    assert len(replay(publisher, 0)) >= 3  # still serving
    for sock in (sub, dealer):
        sock.close(linger=0)
    publisher.close()


def test_a_chain_whose_namespace_is_unknown_is_left_out():
    translator = VllmEventTranslator("m", 4)
    h = block_hashes(list(range(8)), 4, namespace_root("m", salt="t"))
    out = translator.translate([BlockStored(tuple(h), None, "device", tuple(range(8)))],
                               [("", "")])  # the engine did not name the "t" namespace
    assert out == [] and translator.num_unpublished_blocks == 2
    out = translator.translate([BlockStored(tuple(h), None, "device", tuple(range(8)))],
                               [("", "t")])
    assert out[0].extra_keys == [("t",), None]
    assert translator.translate([BlockStored((h[1],), None, "host")])[0].medium == "CPU"


def test_a_batch_that_cannot_be_translated_republishes_everything():
    publisher = VllmEventPublisher(VllmPublisherConfig(heartbeat_s=3600), "m", 4)
    h = block_hashes(list(range(8)), 4, namespace_root("m"))
    publisher.publish(EventBatch("r", "e", 0, (
        BlockStored((h[0],), None, "device", (0, 1, 2, 3)),)), [("", "")])
    publisher.publish(EventBatch("r", "e", 1, (
        BlockStored((h[1],), h[0], "device", (4, 5)),)))  # 2 tokens for a 4-token block
    assert publisher.flush()
    assert [type(e).__name__ for e in events_of(replay(publisher, 2))] == [
        "AllBlocksCleared", "BlockStored"]
    publisher.close()
