"""A lying worker for the workers front: an HTTP server that passes the gateway's health
and model checks, then lies everywhere else, and a ZMQ publisher that sends it huge KV
event batches.

- /metrics: vLLM's queue gauges as NaN and +Inf;
- completions, in turn: a 307 to the trap (a gateway that follows it re-POSTs the tenant's
  prompt there), a 302 to the trap (an internal URL fetched and relayed), a 64 MiB JSON body,
  a 64 MiB SSE line without an end;
- the trap counts every request that reaches it: any is a followed redirect;
- the KV event stream: batches of 200,000 stored blocks (~4 MiB each) on the live socket.
"""

from __future__ import annotations

import itertools
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import zmq

from kv.hashing import DEFAULT_BLOCK_SIZE
from protocol.vllm.frames import seq_bytes
from protocol.vllm.wire import BlockStored, KVEventBatch, encode_batch

HUGE_BYTES = 64 << 20
LIES = ("redirect 307", "redirect 302", "huge body", "huge event")
HUGE_BATCH_BLOCKS = 200_000


class _Handler(BaseHTTPRequestHandler):
    server: LyingWorker

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.startswith("/trap"):
            self.server.trap_hits += 1
            return self._send(200, b'{"secret": "internal"}')
        if self.path == "/health":
            return self._send(200, b"{}")
        if self.path == "/v1/models":
            return self._send(200, b'{"object": "list", "data": [{"id": "tiny"}]}')
        if self.path == "/metrics":
            return self._send(200, b"vllm:num_requests_running NaN\n"
                                   b"vllm:num_requests_waiting +Inf\n", "text/plain")
        self._send(404, b"{}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path.startswith("/trap"):
            self.server.trap_hits += 1
            return self._send(200, b"{}")
        lie = next(self.server.lies)
        self.server.requests += 1
        trap = f"http://127.0.0.1:{self.server.server_address[1]}/trap"
        if lie == "redirect 307":
            return self._send(307, b"", headers={"Location": trap})
        if lie == "redirect 302":
            return self._send(302, b"", headers={"Location": trap})
        streamed = lie == "huge event"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if streamed else
                         "application/json")
        self.send_header("Content-Length", str(HUGE_BYTES + 8))
        self.end_headers()
        try:
            self.wfile.write(b'data: {"' if streamed else b'{"text":"')
            chunk = b"x" * (1 << 20)
            for _ in range(HUGE_BYTES >> 20):
                self.wfile.write(chunk)
        except OSError:  # the gateway stopped reading: what it should do
            pass


class LyingWorker(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lies = itertools.cycle(LIES)
        self.trap_hits = 0
        self.requests = 0
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class HugeBatchPublisher:
    """A ZMQ PUB (and a replay ROUTER that never answers) sending huge batches."""

    def __init__(self):
        self._ctx = zmq.Context()
        self.pub = self._ctx.socket(zmq.PUB)
        self.replay = self._ctx.socket(zmq.ROUTER)
        self.endpoint = f"tcp://127.0.0.1:{self.pub.bind_to_random_port('tcp://127.0.0.1')}"
        port = self.replay.bind_to_random_port("tcp://127.0.0.1")
        self.replay_endpoint = f"tcp://127.0.0.1:{port}"
        stored = BlockStored(block_hashes=list(range(1, HUGE_BATCH_BLOCKS + 1)),
                             parent_block_hash=None,
                             token_ids=[7] * (DEFAULT_BLOCK_SIZE * HUGE_BATCH_BLOCKS),
                             block_size=DEFAULT_BLOCK_SIZE, lora_id=None, medium="GPU",
                             lora_name=None)
        self.payload = encode_batch(KVEventBatch(time.time(), [stored]))
        self.sent = 0

    def send(self, num_batches: int, interval_s: float = 0.5) -> None:
        for _ in range(num_batches):
            self.pub.send_multipart([b"", seq_bytes(self.sent), self.payload])
            self.sent += 1
            time.sleep(interval_s)  # a publisher's pace, not synchronisation

    def close(self) -> None:
        self._ctx.destroy(linger=0)
