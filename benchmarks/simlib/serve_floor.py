"""The floor under `kvroute serve`: a trivial Ray Serve app that does no work.

    python -m benchmarks.simlib.serve_floor --port 8123 [--hops 2 | --direct]

One FastAPI ingress deployment answers `/v1/completions` with a fixed OpenAI body (streamed:
one chunk per token, then usage and [DONE]). With `--hops 2` the ingress asks a second
deployment for the chunks through a streaming handle, as kvroute's gateway asks its engine
replicas. With `--direct` (in an environment with RAY_SERVE_ENABLE_HA_PROXY=1 and
RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY=1) the app has 2 ingress replicas and an
ingress request router: HAProxy asks the router for a replica (`handle.choose_replica`,
as Serve LLM's direct streaming does) and forwards the request to that replica's own HTTP
port. Whatever this costs per request and per token, Serve itself costs kvroute.
Environment variables (RAY_SERVE_*) reach the Serve processes from this driver's env.
(No `from __future__ import annotations`: FastAPI must see `Request` itself in the
signatures Serve's ingress wraps.)
"""

import argparse
import json
import signal
import threading

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve

app = FastAPI()
router_app = FastAPI()
_HEAD = b'data: {"id":"x","object":"text_completion","created":0,"model":"tiny","choices":'


def _chunk(text: str) -> bytes:
    return _HEAD + b'[{"index":0,"text":"' + text.encode() + b'","finish_reason":null}]}\n\n'


def _usage(num_tokens: int) -> bytes:
    usage = {"prompt_tokens": 1, "completion_tokens": num_tokens,
             "total_tokens": num_tokens + 1}
    return _HEAD + b'[],"usage":' + json.dumps(usage).encode() + b"}\n\ndata: [DONE]\n\n"


@serve.deployment(name="Backend", max_ongoing_requests=1024)
class Backend:
    async def tokens(self, num_tokens: int):
        for _ in range(num_tokens):
            yield "a"


@serve.deployment(name="Ingress", max_ongoing_requests=1024)
@serve.ingress(app)
class Ingress:
    def __init__(self, backend=None):
        self.backend = backend

    @app.get("/v1/models")
    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": "tiny", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        body = json.loads(await request.body())
        num_tokens = int(body.get("max_tokens", 1))
        if not body.get("stream"):
            if self.backend is not None:
                text = "".join([t async for t in self._tokens(num_tokens)])
            else:
                text = "a" * num_tokens
            return JSONResponse({"id": "x", "object": "text_completion", "model": "tiny",
                                 "choices": [{"index": 0, "text": text,
                                              "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": 1,
                                           "completion_tokens": num_tokens}})
        return StreamingResponse(self._sse(num_tokens), media_type="text/event-stream")

    async def _tokens(self, num_tokens: int):
        if self.backend is None:
            for _ in range(num_tokens):
                yield "a"
            return
        async for text in self.backend.options(stream=True).tokens.remote(num_tokens):
            yield text

    async def _sse(self, num_tokens: int):
        async for text in self._tokens(num_tokens):
            yield _chunk(text)
        yield _usage(num_tokens)


@serve.deployment(name="FloorRouter", max_ongoing_requests=1000,
                  ray_actor_options={"num_cpus": 0})
@serve.ingress(router_app)
class FloorRouter:
    """HAProxy's `/internal/route`: any replica, as the deployment's request router picks."""

    def __init__(self, ingress):
        self.ingress = ingress

    @router_app.post("/internal/route")
    async def route(self, request: Request) -> dict:
        await request.body()
        async with self.ingress.choose_replica(_reserve=False) as selection:
            replica = selection._replica  # Serve LLM's LLMRouter reads the same fields
            host, port = replica.backend_http_endpoint
            return {"host": host, "port": port,
                    "replica_id": replica.replica_id.to_full_id_str()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--hops", type=int, choices=(1, 2), default=1)
    p.add_argument("--direct", action="store_true")
    p.add_argument("--address", default=None, help="join this Ray instance")
    args = p.parse_args()
    import os

    import ray

    env = {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_")}
    if args.address:
        ray.init(address=args.address, namespace="serve", runtime_env={"env_vars": env})
    else:
        ray.init(num_cpus=2, include_dashboard=False, namespace="serve",
                 object_store_memory=256 * 1024**2)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port},
                controller_options={"runtime_env": {"env_vars": env}})
    if args.direct:
        ingress = Ingress.options(num_replicas=2).bind(None)
        ingress = ingress._with_ingress_request_router(FloorRouter.bind(ingress))
    else:
        ingress = Ingress.bind(Backend.bind() if args.hops == 2 else None)
    serve.run(ingress, name="floor", route_prefix="/")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    if args.address:
        serve.delete("floor")
    else:
        serve.shutdown()


if __name__ == "__main__":
    main()
