"""A replay request to a vLLM-format KV event publisher (protocol: protocol/vllm/frames.py)."""

from __future__ import annotations

import time

import zmq
import zmq.asyncio

from protocol.vllm import frames


async def request_replay(ctx: zmq.asyncio.Context, endpoint: str, start_seq: int,
                         timeout_s: float, max_message_bytes: int = 8 << 20,
                         max_total_bytes: int = 64 << 20) -> list[frames.EventFrame] | None:
    """Every batch the publisher at `endpoint` still has from `start_seq` on, oldest first;
    None when no complete answer comes within `timeout_s`, or the answer passes
    `max_total_bytes` (a frame over `max_message_bytes` never arrives: ZMQ drops the
    link). A fresh DEALER per request, so a late answer to an abandoned request never
    mixes into the next.

    Raises frames.FrameError on an answer that is not a replay frame.
    """
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    dealer.connect(endpoint)
    num_bytes = 0
    deadline = time.monotonic() + timeout_s
    out: list[frames.EventFrame] = []
    try:
        await dealer.send_multipart(frames.replay_request(start_seq))
        while True:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or not await dealer.poll(remaining_s * 1000):
                return None
            frame = frames.parse_replay_frames(await dealer.recv_multipart())
            if frame is None:
                return out
            num_bytes += len(frame.payload)
            if num_bytes > max_total_bytes:
                return None
            out.append(frame)
    finally:
        dealer.close(linger=0)
