"""An engine replica's side of direct routing: a signed route header is claimed and ended
whatever answers the request; a forged one is served as not routed, and counted."""

import asyncio

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from router.cluster.route_ends import claim_of, end_of, refusal_of, split_reports
from router.serve.route_header import ROUTE_HEADER, Route, RouteSigner, new_route_key
from router.serve.route_tracking import ROUTED_BY_HEADER, RouteReports, RouteTracking
from worker.openai.prompt_hits import PROMPT_HITS_KEY

SIGNER = RouteSigner(new_route_key())
ROUTE = Route("router-a", "0123abcd")
ENDED_AT_S = 1_700_000_000.25  # the replica's clock when each request ends
ENDED = end_of(ROUTE.route_id, None, None, ENDED_AT_S)


def test_only_the_apps_key_signs_a_route():
    header = SIGNER.header(ROUTE)
    assert SIGNER.verify(header) == ROUTE
    router_id, route_id, mac = header.rsplit(" ", 2)
    for forged in (f"{router_id} {route_id}",  # unsigned (what routers used to send)
                   f"{router_id} ffff {mac}",  # another route under this one's MAC
                   f"router-b {route_id} {mac}",
                   RouteSigner(new_route_key()).header(ROUTE),  # another app's key
                   "", "   ", "x y z"):
        assert SIGNER.verify(forged) is None, forged
    with pytest.raises(ValueError):
        RouteSigner(b"short")


def _client(forged: list) -> tuple[TestClient, RouteReports]:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions() -> StreamingResponse:
        async def chunks():
            yield b"data: 1\n\n"
            yield b"data: [DONE]\n\n"
        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat() -> dict:
        raise ValueError("the engine failed")

    @app.post("/tokenize")
    async def tokenize() -> dict:
        return {"tokens": [1]}

    reports = RouteReports(clock=lambda: ENDED_AT_S)
    app.add_middleware(RouteTracking, signer=SIGNER, reports=reports,
                       on_forged=lambda: forged.append(1))
    return TestClient(app, raise_server_exceptions=False), reports


def test_every_routed_request_is_claimed_and_ended_whatever_answers_it():
    client, reports = _client([])
    headers = {ROUTE_HEADER: SIGNER.header(ROUTE)}
    streamed = client.post("/v1/completions", headers=headers)
    assert streamed.status_code == 200 and streamed.headers[ROUTED_BY_HEADER] == "router-a"
    assert reports.take() == {"router-a": (claim_of(ROUTE.route_id), ENDED)}
    # an unknown path, a path that generates nothing: ended as refused
    for method, path, status in (("POST", "/v1/nothing", 404), ("POST", "/tokenize", 200)):
        assert client.request(method, path, headers=headers).status_code == status
        reported = reports.take()["router-a"]
        assert reported == (claim_of(ROUTE.route_id), refusal_of(ROUTE.route_id))
        assert split_reports(reported).refused == [ROUTE.route_id]
    # an exception may come after work was done: ended as run
    assert client.post("/v1/chat/completions", headers=headers).status_code == 500
    assert reports.take() == {"router-a": (claim_of(ROUTE.route_id), ENDED)}


def test_a_forged_route_header_is_served_as_not_routed_and_counted():
    forged = []
    client, reports = _client(forged)
    for value in (f"{ROUTE.router_id} {ROUTE.route_id}",
                  RouteSigner(new_route_key()).header(ROUTE)):
        response = client.post("/v1/completions", headers={ROUTE_HEADER: value})
        assert response.status_code == 200 and ROUTED_BY_HEADER not in response.headers
    assert client.post("/v1/completions").status_code == 200  # no header: not routed
    assert reports.take() == {} and forged == [1, 1]


async def test_a_request_its_client_left_ends_as_run_under_any_root_path():
    async def cancelled(scope, receive, send) -> None:
        raise asyncio.CancelledError  # what Starlette does to a handler whose client left

    reports = RouteReports(clock=lambda: ENDED_AT_S)
    tracking = RouteTracking(cancelled, SIGNER, reports)
    header = (ROUTE_HEADER.encode(), SIGNER.header(ROUTE).encode())
    scope = {"type": "http", "path": "/app/v1/completions", "root_path": "/app",
             "headers": [header]}
    with pytest.raises(asyncio.CancelledError):
        await tracking(scope, None, None)
    assert reports.take() == {"router-a": (claim_of(ROUTE.route_id), ENDED)}


def test_an_end_carries_the_prompt_tokens_the_engine_served_from_cache():
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        request.scope[PROMPT_HITS_KEY].observe(48)  # as the serving layer fills it
        return {}

    reports = RouteReports(clock=lambda: ENDED_AT_S)
    app.add_middleware(RouteTracking, signer=SIGNER, reports=reports)
    client = TestClient(app)
    headers = {ROUTE_HEADER: SIGNER.header(ROUTE)}
    assert client.post("/v1/chat/completions", headers=headers).status_code == 200
    reported = reports.take()["router-a"]
    assert reported == (claim_of(ROUTE.route_id), end_of(ROUTE.route_id, 48, None, ENDED_AT_S))
    split = split_reports(reported)
    assert split.ended == [ROUTE.route_id] and split.cached_tokens == {ROUTE.route_id: 48}
    # an end without a count (the engine reported none) carries none
    assert split_reports([end_of(ROUTE.route_id, None)]).cached_tokens == {}


def test_an_end_carries_the_tokens_the_request_produced():
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict:
        request.scope[PROMPT_HITS_KEY].output_tokens = 5  # as the serving layer counts them
        return {}

    reports = RouteReports(clock=lambda: ENDED_AT_S)
    app.add_middleware(RouteTracking, signer=SIGNER, reports=reports)
    headers = {ROUTE_HEADER: SIGNER.header(ROUTE)}
    assert TestClient(app).post("/v1/completions", headers=headers).status_code == 200
    reported = reports.take()["router-a"]
    assert reported == (claim_of(ROUTE.route_id), end_of(ROUTE.route_id, None, 5, ENDED_AT_S))
    assert split_reports(reported).output_tokens == {ROUTE.route_id: 5}
