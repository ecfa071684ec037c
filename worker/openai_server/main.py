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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import uvicorn
from pydantic import BaseModel, ConfigDict, Field

from worker.engine.config import EngineConfig, EngineSettings
from worker.openai_server.kv_events import EventPump, EventPumpConfig
from worker.process_settings import ProcessSettings
from worker.settings import add_flags, flag_name, given_flags, load_settings

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


class EngineServerSettings(BaseModel):
    """Where `kvroute engine` serves its engine, and its KV events."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replica_id: str | None = Field(
        None, min_length=1, description="this engine's name in its KV events and metrics "
                                        "(unset: HOSTNAME-PID)")
    host: str = Field("127.0.0.1", min_length=1, description="HTTP listen address")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port (0: any free port)")
    kv_events_port: int | None = Field(
        None, ge=0, le=65535,
        description="publish the KV cache events in vLLM's format on this port of --host (ZMQ "
                    "PUB: [topic, 8-byte seq, msgpack KVEventBatch]; 0: any free port); off "
                    "when unset")
    kv_events_replay_port: int | None = Field(
        None, ge=0, le=65535, description="the replay socket (ZMQ ROUTER) that resends "
                                          "batches from a seq (unset: --kv-events-port + 1; "
                                          "any free port when that is 0)")
    kv_events_topic: str = Field("", description="the topic frame of every batch")
    graceful_shutdown_timeout_s: float = Field(
        60.0, gt=0, description="on SIGTERM, how long accepted requests may run before they "
                                "are cancelled")


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `kvroute engine`: the engine's settings are `kvroute serve`'s (one model,
    worker/engine/config.py), each also set by its KVROUTE_<NAME> variable."""
    add_flags(p, EngineSettings)
    # Where it listens is read from flags only: Kubernetes injects KVROUTE_PORT=tcp://...
    # into every pod of a namespace with a Service named kvroute.
    add_flags(p, EngineServerSettings, env=False)


def configs_from(ns: argparse.Namespace, environ: Mapping[str, str] = os.environ
                 ) -> tuple[EngineConfig, ServerConfig]:
    """Raises ValueError (SettingsError) naming the bad setting."""
    engine = load_settings(EngineSettings, given_flags(ns, EngineSettings), environ, flag_name)
    server = load_settings(EngineServerSettings, given_flags(ns, EngineServerSettings), {},
                           flag_name)
    replica_id = server.replica_id or f"{socket.gethostname()}-{os.getpid()}"
    return (engine.engine_config(replica_id=replica_id),
            ServerConfig(**server.model_dump(exclude={"replica_id"})))


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
    from worker.engine.engine import Engine
    from worker.openai.prompt import PromptBuilder
    from worker.openai_server.app import create_app
    from worker.tokenizer.files import tokenizer_dir

    publisher = None
    try:
        engine_config, server_config = configs_from(ns)
        process = ProcessSettings.from_environ(os.environ)  # limits, the cache directory
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
    app = create_app(engine, prompts, pump, process)
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
    parser = argparse.ArgumentParser(prog="kvroute engine", description=__doc__.splitlines()[0])
    add_engine_arguments(parser)
    return run_engine(parser.parse_args(argv))
