"""`kvroute engine`'s HTTP app: one engine replica as an OpenAI-compatible server.

Routes: /v1/completions and /v1/chat/completions (serving.py), /v1/models (with the
context length, as vLLM reports it), /tokenize, /detokenize and /version (vLLM's shapes),
/health (503 once the engine cannot serve), /metrics (the engine's kvroute_engine_* series
and vLLM's gauge names). The app's lifespan starts the KV event pump; at shutdown, after
the HTTP server has let the accepted requests finish, it drains the engine, then publishes
the last events and closes the sink.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from worker.api import EngineUnhealthyError
from worker.engine import Engine
from worker.openai.errors import APIError
from worker.openai.http_errors import install_error_handlers
from worker.openai.limits import read_body
from worker.openai.prompt import PromptBuilder
from worker.openai.stream_slots import StreamSlots
from worker.openai.tokenize import detokenize, tokenize, version_body
from worker.openai_server.kv_events import EventPump
from worker.openai_server.serving import OpenAIServing
from worker.openai_server.vllm_metrics import VLLMGaugeCollector
from worker.process_settings import ProcessSettings


def create_app(engine: Engine, prompts: PromptBuilder, pump: EventPump,
               settings: ProcessSettings) -> FastAPI:
    """The app serving `engine`; `prompts` tokenizes for the same model; `settings`:
    the process's limits."""
    # No tenants: a stream limit only where the operator set one (on all streams together).
    serving = OpenAIServing(engine, prompts, limits=settings.request_limits(),
                            streams=StreamSlots.for_tenants(
                                False, settings.max_streams_per_tenant))
    vllm_registry = CollectorRegistry(auto_describe=True)
    vllm_registry.register(VLLMGaugeCollector(engine.stats, engine.model_name))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pump.start()
        try:
            yield
        finally:
            await engine.shutdown()  # finishes whatever is still running
            await pump.stop()  # then the events of that work go out too

    app = FastAPI(title="kvroute engine", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    install_error_handlers(app)

    # Wrapped, so FastAPI does not offer the methods' cache_salt as a query parameter: a
    # standalone engine has no tenants.
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serving.completions(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serving.chat_completions(request)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": engine.model_name, "object": "model", "created": 0, "owned_by": "kvroute",
            "root": engine.model_name, "max_model_len": engine.max_model_len}]}

    @app.post("/tokenize")
    async def tokenize_endpoint(request: Request) -> dict:
        return tokenize(await read_body(request, serving.limits), prompts, serving.check_model,
                        engine.max_model_len, serving.limits)

    @app.post("/detokenize")
    async def detokenize_endpoint(request: Request) -> dict:
        return detokenize(await read_body(request, serving.limits), prompts,
                          serving.check_model, serving.limits)

    @app.get("/version")
    async def version() -> dict:
        return version_body()

    @app.get("/health")
    async def health() -> Response:
        try:
            engine.check_health()
        except EngineUnhealthyError as err:
            error = APIError(503, str(err), type_="service_unavailable_error",
                             code="engine_unhealthy")
            return JSONResponse(error.body(), status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        body = generate_latest(engine.registry) + generate_latest(vllm_registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app
