"""`kvroute engine`'s HTTP app: one engine replica as an OpenAI-compatible server.

The front door's route table (worker/openai/routes.py) with this engine behind it: no API
keys (one anonymous tenant), /v1/completions and /v1/chat/completions (serving.py),
/health and /ready (503 once the engine cannot serve), /metrics (the engine's
kvroute_engine_* series and vLLM's gauge names). The app's lifespan starts the KV event
pump; at shutdown, after the HTTP server has let the accepted requests finish, it drains the
engine, then publishes the last events and closes the sink.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.engine import EngineUnhealthyError
from worker.engine.engine import Engine
from worker.openai.errors import APIError
from worker.openai.front import Anonymous, FrontDoor, fixed_context, ready_body
from worker.openai.prompt import PromptBuilder
from worker.openai.routes import OwnRoutes, build_app, route_table
from worker.openai.stream_slots import StreamSlots
from worker.openai_server.kv_events import EventPump
from worker.openai_server.serving import OpenAIServing
from worker.openai_server.vllm_metrics import VLLMGaugeCollector
from worker.process_settings import ProcessSettings


def create_app(engine: Engine, prompts: PromptBuilder, pump: EventPump,
               settings: ProcessSettings) -> Starlette:
    """The app serving `engine`; `prompts` tokenizes for the same model; `settings`:
    the process's limits."""
    # No tenants: a stream limit only where the operator set one (on all streams together).
    door = FrontDoor(engine.model_name, prompts, settings.request_limits(), Anonymous(),
                     StreamSlots.for_tenants(False, settings.max_streams_per_tenant),
                     fixed_context(engine.max_model_len))
    serving = OpenAIServing(engine, door)
    vllm_registry = CollectorRegistry(auto_describe=True)
    vllm_registry.register(VLLMGaugeCollector(engine.stats, engine.model_name,
                                              block_size=engine.config.block_size))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pump.start()
        try:
            yield
        finally:
            await engine.shutdown()  # finishes whatever is still running
            await pump.stop()  # then the events of that work go out too

    def unhealthy() -> APIError | None:
        try:
            engine.check_health()
        except EngineUnhealthyError as err:
            return APIError(503, str(err), type_="service_unavailable_error",
                            code="engine_unhealthy")
        return None

    async def completions(request: Request) -> Response:
        return await serving.completions(request)

    async def chat_completions(request: Request) -> Response:
        return await serving.chat_completions(request)

    async def health(request: Request) -> Response:
        error = unhealthy()
        if error is not None:
            return JSONResponse(error.body(), status_code=503)
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        body, status = ready_body(unhealthy() is None)
        return JSONResponse(body, status_code=status)

    async def metrics(request: Request) -> Response:
        body = generate_latest(engine.registry) + generate_latest(vllm_registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    own = OwnRoutes(completions, chat_completions, ready, metrics, health=health)
    return build_app(route_table(door, own), title="kvroute engine", lifespan=lifespan)
