"""/openapi.json: every route the app serves, its bodies generated from the structs."""

from __future__ import annotations

import msgspec

from dspark_loop.api.chat.schemas import ChatCompletionRequest
from dspark_loop.api.schemas import CompletionRequest
from tests.unit.api.harness import serving


async def test_the_document_lists_exactly_the_routes_the_app_serves():
    """Every (method, path) the router answers must be in the document and vice versa,
    so a new route cannot go undocumented."""
    async with serving() as client:
        doc = await (await client.get("/openapi.json")).json()
        served = {
            (route.method.lower(), route.resource.canonical)
            for route in client.server.app.router.routes()
            if route.method != "HEAD"
        }
        documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
        assert documented == served


async def test_request_schemas_are_the_decoders_own_and_refuse_unknown_fields():
    """The request body schemas must equal msgspec's schema of the structs the routes
    decode with, plus additionalProperties false (the decoders forbid unknown fields)."""
    async with serving() as client:
        doc = await (await client.get("/openapi.json")).json()
    _, expected = msgspec.json.schema_components(
        [CompletionRequest, ChatCompletionRequest], ref_template="#/components/schemas/{name}"
    )
    schemas = doc["components"]["schemas"]
    for name in ("CompletionRequest", "ChatCompletionRequest", "StreamOptions"):
        assert schemas[name] == {**expected[name], "additionalProperties": False}
    body = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/CompletionRequest"}
    assert doc["openapi"] == "3.1.0"


async def test_security_is_declared_only_on_keyed_routes_of_a_keyed_server():
    """With API keys the model routes must declare the bearer scheme and /health must not;
    without keys no route declares any."""
    async with serving(api_keys=("sk-x",)) as client:
        doc = await (await client.get("/openapi.json")).json()
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert doc["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
        assert "security" not in doc["paths"]["/health"]["get"]
    async with serving() as client:
        doc = await (await client.get("/openapi.json")).json()
        assert not any("security" in op for ops in doc["paths"].values() for op in ops.values())
