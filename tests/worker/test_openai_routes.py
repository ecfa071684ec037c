"""The front door's route table: the same answers from a FastAPI app and a plain Starlette
app (the external gateway's), OpenAI error bodies for a bad route or method, and an OpenAPI
document that declares the bodies and path parameters the handlers read themselves."""

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from worker.openai.front import Anonymous, FrontDoor, fixed_context
from worker.openai.limits import RequestLimits
from worker.openai.prompt import PromptBuilder
from worker.openai.routes import OwnRoutes, Route, build_app, route_table
from worker.openai.tokenize import kvroute_version
from worker.tokenizer.files import tokenizer_dir

MODELS = {"object": "list", "data": [{"id": "tiny", "object": "model", "created": 0,
                                      "owned_by": "kvroute", "root": "tiny",
                                      "max_model_len": 64}]}


async def echo(request: Request) -> Response:
    return JSONResponse({"path": request.url.path, **request.path_params})


@pytest.fixture(scope="module")
def door() -> FrontDoor:
    return FrontDoor("tiny", PromptBuilder(tokenizer_dir("tiny"), "tiny", 16),
                     RequestLimits(), Anonymous(), None, fixed_context(64))


@pytest.mark.parametrize("plain", [False, True])
async def test_both_kinds_of_app_answer_the_same(door, plain):
    own = OwnRoutes(echo, echo, echo, echo,
                    extra=(Route("DELETE", "/v1/things/{name}", echo),))
    app = build_app(route_table(door, own), title="t", plain=plain)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        assert (await client.get("/v1/models")).json() == MODELS
        assert (await client.post("/v1/completions", json={})).json() == {
            "path": "/v1/completions"}
        assert (await client.delete("/v1/things/abc")).json() == {
            "path": "/v1/things/abc", "name": "abc"}
        assert (await client.post("/tokenize", json={"prompt": "ab"})).json() == {
            "count": 3, "max_model_len": 64, "tokens": [256, 97, 98]}
        assert (await client.get("/version")).json() == {"version": kvroute_version()}
        assert (await client.get("/health")).json() == {"status": "ok"}
        other = await client.post("/v1/models")
        assert other.status_code == 405
        assert other.json()["error"]["code"] == "method_not_allowed"
        wrong_model = await client.post("/tokenize", json={"model": "gpt-4", "prompt": "a"})
        assert (wrong_model.status_code, wrong_model.json()["error"]["code"]) == (
            404, "model_not_found")


async def test_the_openapi_document_declares_bodies_and_path_parameters(door):
    own = OwnRoutes(echo, echo, echo, echo,
                    extra=(Route("DELETE", "/v1/things/{name}", echo),))
    app = build_app(route_table(door, own), title="t", openapi=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        doc = (await client.get("/openapi.json")).json()
    body = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]
    assert "prompt" in body["application/json"]["schema"]["properties"]
    assert doc["paths"]["/v1/things/{name}"]["delete"]["parameters"] == [
        {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
    assert "parameters" not in doc["paths"]["/v1/completions"]["post"]  # no query "request"


async def test_an_unknown_context_is_left_out_of_the_list_and_refuses_what_needs_it():
    async def unknown() -> int | None:
        return None

    door = FrontDoor("tiny", PromptBuilder(tokenizer_dir("tiny"), "tiny", 16),
                     RequestLimits(), Anonymous(), None, unknown)
    assert await door.models_body() == {"object": "list", "data": [{
        "id": "tiny", "object": "model", "created": 0, "owned_by": "kvroute", "root": "tiny"}]}
    app = build_app(route_table(door, OwnRoutes(echo, echo, echo, echo)), title="t")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        refused = await client.post("/tokenize", json={"prompt": "ab"})
    assert (refused.status_code, refused.json()["error"]["code"]) == (503, "context_unknown")
