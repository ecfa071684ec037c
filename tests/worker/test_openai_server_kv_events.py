"""`kvroute engine --kv-events-port`: a real server subprocess publishes its KV cache events
in vLLM's wire format, live on ZMQ PUB and again from its replay socket."""

import socket

import openai
import pytest
import zmq

from benchmarks.simlib.engine_workers import SIM_TINY_ARGS, EngineWorker
from kv.hashing import block_hashes, namespace_root
from protocol.vllm import frames, wire

B = 16


@pytest.fixture(scope="module")
def worker():
    w = EngineWorker.start((*SIM_TINY_ARGS, "--kv-events-port", "0", "--kv-events-topic", "kv"))
    yield w
    assert w.stop() == 0


def replay(endpoint: str, start_seq: int) -> list[frames.EventFrame]:
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
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


def stores(frame_list: list[frames.EventFrame]) -> list[wire.BlockStored]:
    return [e for f in frame_list for e in wire.decode_batch(f.payload).batch.events
            if isinstance(e, wire.BlockStored)]


def test_a_prompts_blocks_are_published_live_and_replayed(worker):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(worker.kv_events_endpoint)
    try:
        # A subscription is live once a frame arrives: the publisher's heartbeat (1 s).
        assert sub.poll(10_000), "no heartbeat from the publisher"
        heartbeat = frames.parse_pub_frames(sub.recv_multipart())
        prompt = [(7 * i) % 200 + 3 for i in range(3 * B + 2)]
        oai = openai.OpenAI(base_url=worker.base_url, api_key="unused", max_retries=0)
        oai.completions.create(model="tiny", prompt=prompt, max_tokens=1)
        live = []
        while len(stores(live)) == 0 and sub.poll(10_000):
            live.append(frames.parse_pub_frames(sub.recv_multipart()))
    finally:
        sub.close(linger=0)
    expected = block_hashes(prompt, B, namespace_root("tiny"))
    stored = stores(live)
    assert [h for e in stored for h in e.block_hashes] == expected
    assert [t for e in stored for t in e.token_ids] == prompt[:3 * B]
    assert stored[0].parent_block_hash is None
    assert {(e.block_size, e.medium, e.lora_id) for e in stored} == {(B, "GPU", None)}
    assert {f.topic for f in live} == {b"kv"}
    assert [f.seq for f in live] == list(range(heartbeat.seq + 1, live[-1].seq + 1))
    replayed = replay(worker.kv_events_replay_endpoint, 0)
    assert [f.seq for f in replayed] == list(range(len(replayed)))
    assert len(replayed) > live[-1].seq
    assert stores(replayed) == stored


def test_a_taken_events_port_fails_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"cannot bind the KV event sockets "
                                               f"tcp://127.0.0.1:{port}"):
            EngineWorker.start((*SIM_TINY_ARGS, "--kv-events-port", str(port)))
