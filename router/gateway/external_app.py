"""The external gateway's HTTP app: the front door's route table (worker/openai/routes.py)
with the gateway's handlers behind it, plus the worker set's admin API, counted by the
routers' request counter.

A plain Starlette app (no FastAPI endpoint wrapper in the token path): every handler takes
the request and answers a Response; errors become OpenAI error bodies.
"""

from __future__ import annotations

from starlette.applications import Starlette

from router.front.metrics import CountRequests
from router.front.routes import cluster_metrics
from router.gateway.external_gateway import ExternalGateway
from worker.openai.routes import OwnRoutes, Route, build_app, route_table


def create_app(gateway: ExternalGateway) -> CountRequests:
    """The gateway's routes (once it is started), wrapped in its request counter."""
    g = gateway
    workers = (Route("GET", "/v1/workers", g.list_workers),
               Route("POST", "/v1/workers", g.add_worker),
               Route("DELETE", "/v1/workers", g.remove_worker))
    # /tokenize and /detokenize go to a worker (it knows its own context length).
    own = OwnRoutes(g.completions, g.chat_completions, g.ready, cluster_metrics(g.hub),
                    tokenize=g.tokenizer_call, detokenize=g.tokenizer_call, extra=workers)
    app: Starlette = build_app(route_table(g.door, own), title="kvroute", plain=True)
    app.state.gateway_metrics = g.metrics
    return CountRequests(app)
