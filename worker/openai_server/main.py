"""`kvroute engine`: build one engine, serve it over HTTP until SIGINT/SIGTERM.

The engine is built (and the model loaded) before the server binds, so a listening port
means a ready engine; the line `kvroute engine: serving MODEL at http://HOST:PORT/v1` on
stdout says so (with the port really bound, also for --port 0); with --kv-events-port, a
line before it names the KV event sockets. SIGTERM or SIGINT stops
accepting connections, lets the accepted requests finish (up to
--graceful-shutdown-timeout-s), drains the engine and exits 0; a second SIGINT forces out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import uvicorn

from worker.engine_config import EngineConfig
from worker.openai_server.kv_events import EventPump, EventPumpConfig

if TYPE_CHECKING:  # zmq and the publisher load only when events are published
    from worker.openai_server.vllm_sink import VllmEventsConfig


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (printed when ready)
    graceful_shutdown_timeout_s: float = 60.0  # then requests still running are cancelled
    kv_events_interval_s: float = 0.01
    kv_events_port: int | None = None  # vLLM-format KV events on ZMQ; None: not published
    kv_events_replay_port: int | None = None  # default: kv_events_port + 1 (0: any)
    kv_events_topic: str = ""

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if not self.graceful_shutdown_timeout_s > 0:
            raise ValueError(f"graceful_shutdown_timeout_s must be > 0, got "
                             f"{self.graceful_shutdown_timeout_s}")
        EventPumpConfig(self.kv_events_interval_s)  # validates the interval
        if self.kv_events_port is None and self.kv_events_replay_port is not None:
            raise ValueError("kv_events_replay_port needs kv_events_port")
        if self.kv_events_port is not None:
            self.vllm_events()  # validates the ports

    def vllm_events(self) -> VllmEventsConfig:
        from worker.openai_server.vllm_sink import VllmEventsConfig

        assert self.kv_events_port is not None
        return VllmEventsConfig(self.host, self.kv_events_port, self.kv_events_replay_port,
                                self.kv_events_topic)


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `kvroute engine`: `kvroute serve`'s spellings for the engine's settings
    (router/serve/settings.py), vLLM's for the rest where vLLM has the same setting."""
    p.add_argument("--model", default="tiny",
                   help="'tiny' (embedded random-weight Llama, generated on first use) or a "
                        "Hugging Face Llama-family checkpoint directory")
    p.add_argument("--served-model-name", default="",
                   help="the model name of the API and of the KV hash namespace (empty: "
                        "'tiny', or the checkpoint directory's name)")
    p.add_argument("--engine", default="real", choices=("real", "sim"),
                   help="real: run the model; sim: simulated executor (modelled step "
                        "times, no model compute)")
    p.add_argument("--sim-preset", default="h100-llama3-8b",
                   help="timing preset of the simulated executor (e.g. tiny)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (local processes)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--num-blocks", type=int, default=1024,
                   help="KV blocks (device pool); caps the context length too")
    p.add_argument("--num-host-blocks", type=int, default=0,
                   help="host-memory KV blocks (0: no host tier)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context length limit (default: the model's, capped by the pool)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests per step, at most")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="tokens per step, at most")
    p.add_argument("--replica-id", default=None,
                   help="this engine's name in its KV events and metrics (default: "
                        "HOSTNAME-PID)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP listen address")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0: any free port)")
    p.add_argument("--kv-events-port", type=int, default=None,
                   help="publish the KV cache events in vLLM's format on this port of --host "
                        "(ZMQ PUB: [topic, 8-byte seq, msgpack KVEventBatch]; 0: any free "
                        "port); off by default")
    p.add_argument("--kv-events-replay-port", type=int, default=None,
                   help="the replay socket (ZMQ ROUTER) that resends batches from a seq "
                        "(default: --kv-events-port + 1; any free port when that is 0)")
    p.add_argument("--kv-events-topic", default="", help="the topic frame of every batch")
    p.add_argument("--graceful-shutdown-timeout-s", type=float, default=60.0,
                   help="on SIGTERM, how long accepted requests may run before they are "
                        "cancelled")


def configs_from(ns: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    """Raises ValueError naming the bad setting."""
    replica_id = ns.replica_id or f"{socket.gethostname()}-{os.getpid()}"
    engine = EngineConfig(
        model=ns.model, served_model_name=ns.served_model_name, replica_id=replica_id,
        engine=ns.engine, sim_preset=ns.sim_preset, tp=ns.tp, block_size=ns.block_size,
        num_blocks=ns.num_blocks, num_host_blocks=ns.num_host_blocks,
        max_model_len=ns.max_model_len, max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens)
    server = ServerConfig(host=ns.host, port=ns.port,
                          graceful_shutdown_timeout_s=ns.graceful_shutdown_timeout_s,
                          kv_events_port=ns.kv_events_port,
                          kv_events_replay_port=ns.kv_events_replay_port,
                          kv_events_topic=ns.kv_events_topic)
    return engine, server


class _Server(uvicorn.Server):
    """Says where it listens once it really does."""

    def __init__(self, config: uvicorn.Config, model_name: str):
        super().__init__(config)
        self._model_name = model_name

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.servers:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(f"kvroute engine: serving {self._model_name!r} at http://{host}:{port}/v1",
                  flush=True)


def run_engine(ns: argparse.Namespace) -> int:
    """Runs `kvroute engine` with parsed flags; the exit status."""
    from worker.engine import Engine
    from worker.openai.prompt import PromptBuilder
    from worker.openai_server.app import create_app
    from worker.tokenizer_files import tokenizer_dir

    publisher = None
    try:
        engine_config, server_config = configs_from(ns)
        if server_config.kv_events_port is not None:  # bound first: a taken port fails fast
            from worker.openai_server.vllm_sink import open_publisher

            publisher = open_publisher(server_config.vllm_events(),
                                       engine_config.served_model_name, engine_config.block_size)
        engine = Engine.from_config(engine_config)
        prompts = PromptBuilder(tokenizer_dir(engine_config.model), engine.model_name,
                                engine_config.block_size)
    except (ValueError, OSError) as err:  # FileNotFoundError: no such model
        if publisher is not None:
            publisher.close()
        print(f"kvroute engine: {err}", file=sys.stderr)
        return 2
    sink = None
    if publisher is not None:
        from worker.openai_server.vllm_sink import VllmEventSink

        sink = VllmEventSink(publisher, engine)
        print(f"kvroute engine: KV events (vLLM format) on {publisher.endpoint}, replay on "
              f"{publisher.replay_endpoint}, topic {server_config.kv_events_topic!r}",
              flush=True)
    pump = EventPump(engine.drain_events, sink,
                     EventPumpConfig(server_config.kv_events_interval_s))
    app = create_app(engine, prompts, pump)
    config = uvicorn.Config(app, host=server_config.host, port=server_config.port,
                            log_level="warning", access_log=False,
                            timeout_graceful_shutdown=server_config.graceful_shutdown_timeout_s)
    server = _Server(config, engine.model_name)
    # uvicorn re-raises the signal that stopped it under the handlers it found; these make
    # that a no-op, so a graceful stop ends here with status 0 rather than killed by SIGTERM.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    asyncio.run(server.serve())
    if not server.started:
        return 1  # uvicorn has logged why (e.g. the port is taken)
    print("kvroute engine: stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvroute engine", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_engine_arguments(parser)
    return run_engine(parser.parse_args(argv))
