"""/openapi.json: every route the app serves, its bodies generated from the structs."""

from __future__ import annotations

import msgspec

from dspark_loop.api.app import CONTEXT_KEY
from dspark_loop.api.chat.schemas import ChatCompletionRequest
from dspark_loop.api.openapi import _bound_token_ids
from dspark_loop.api.schemas import CompletionRequest, StreamOptions
from tests.unit.api.harness import serving
from tests.unit.api.scripted import chat_engine


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
    decode with, plus additionalProperties false (the decoders forbid unknown fields) and
    the served vocabulary's top id on every token id, the context's room on every output
    length and prompt id list, and each struct's rules across fields."""
    async with serving() as client:
        doc = await (await client.get("/openapi.json")).json()
        vocab_size = client.server.app[CONTEXT_KEY].encoder.vocab_size
        max_model_len = client.server.app[CONTEXT_KEY].max_model_len
    _, expected = msgspec.json.schema_components(
        [CompletionRequest, ChatCompletionRequest], ref_template="#/components/schemas/{name}"
    )
    _bound_token_ids(expected, vocab_size, max_model_len)
    schemas = doc["components"]["schemas"]
    for name, struct in (
        ("CompletionRequest", CompletionRequest),
        ("ChatCompletionRequest", ChatCompletionRequest),
        ("StreamOptions", StreamOptions),
    ):
        assert schemas[name] == {**expected[name], "additionalProperties": False, **struct.SCHEMA_RULES}
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


async def test_the_bodies_every_route_refuses_when_empty_have_their_fields_required():
    """`{}` is refused by /v1/completions, /v1/chat/completions, /tokenize and /detokenize,
    so the document must not call it valid: prompt, messages and tokens are required, and
    /tokenize needs exactly one of prompt and text."""
    async with serving() as client:
        doc = await (await client.get("/openapi.json")).json()
        for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
            assert (await client.post(path, json={})).status == 400
    schemas = doc["components"]["schemas"]
    assert "prompt" in schemas["CompletionRequest"]["required"]
    assert "messages" in schemas["ChatCompletionRequest"]["required"]
    assert schemas["ChatCompletionRequest"]["properties"]["messages"]["minItems"] == 1
    assert schemas["DetokenizeRequest"]["required"] == ["tokens"]
    assert [rule["required"] for rule in schemas["TokenizeRequest"]["oneOf"]] == [["prompt"], ["text"]]


async def test_token_ids_are_bounded_by_the_served_vocabulary():
    """Every token id the document describes must have the vocabulary's range, the same
    range the server checks ids against."""
    async with serving() as client:
        doc = await (await client.get("/openapi.json")).json()
        top = client.server.app[CONTEXT_KEY].encoder.vocab_size - 1
        assert (await client.post("/detokenize", json={"tokens": [top]})).status == 200
        assert (await client.post("/detokenize", json={"tokens": [top + 1]})).status == 400
    schemas = doc["components"]["schemas"]
    assert schemas["DetokenizeRequest"]["properties"]["tokens"]["items"] == {
        "title": "TokenId",
        "type": "integer",
        "minimum": 0,
        "maximum": top,
    }
    assert schemas["CompletionRequest"]["properties"]["stop_token_ids"]["anyOf"][0]["items"]["maximum"] == top


async def test_a_field_out_of_its_bounds_gets_a_400_stating_the_published_range():
    """A value past a field's Meta bound must get a 400 naming the field and its range as
    the document publishes it (one fact for both)."""
    async with serving() as client:
        doc = await (await client.get("/openapi.json")).json()
        r = await client.post("/v1/completions", json={"prompt": "hi", "top_p": 0})
        err = (await r.json())["error"]
    top_p = doc["components"]["schemas"]["CompletionRequest"]["properties"]["top_p"]["anyOf"][0]
    assert (top_p["exclusiveMinimum"], top_p["maximum"]) == (0, 1)
    assert r.status == 400
    assert (err["param"], err["message"]) == ("top_p", "`top_p` must be in (0, 1], got 0.")


async def test_a_wrong_method_answer_lists_the_allowed_methods():
    """A 405 must carry the Allow header (RFC 9110) along with the OpenAI error body."""
    async with serving() as client:
        r = await client.request("TRACE", "/v1/completions")
        assert r.status == 405
        assert r.headers["Allow"] == "POST"
        assert (await r.json())["error"]["code"] == "method_not_allowed"


TOP_LOGPROBS_BODIES = [
    {"top_logprobs": 2},
    {"top_logprobs": 2, "logprobs": False},
    {"top_logprobs": 2, "logprobs": None},
    {"top_logprobs": 2, "logprobs": True},
    {"top_logprobs": 0},
    {"top_logprobs": None, "logprobs": False},
    {"logprobs": True},
]


PERSON = {"type": "object", "properties": {"name": {"type": "string"}}}
FORMAT_BODIES = [
    {"response_format": {"type": "text"}},
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "xml"}},
    {"response_format": {"type": "json_schema"}},
    {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": True}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": False}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": "yes"}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": 0}}},
    {"structured_outputs": {"json_object": 0}},
    {"structured_outputs": {}},
    {"structured_outputs": {"json": PERSON}},
    {"structured_outputs": {"json": PERSON, "json_object": False, "regex": None}},
    {"structured_outputs": {"json": PERSON, "json_object": True}},
    {"structured_outputs": {"json_object": True}},
    {"structured_outputs": {"json_object": 1}},
    {"structured_outputs": {"regex": "a+"}},
    {"structured_outputs": {"regex": ""}},
    {"structured_outputs": {"regex": "a+", "json_object": False}},
    {"structured_outputs": {"choice": ["yes", "no"]}},
    {"structured_outputs": {"choice": []}},
    {"structured_outputs": {"choice": ["a", 5]}},
    {"structured_outputs": {"choice": ["a"], "regex": "a"}},
    {"structured_outputs": {"grammar": "root ::= 'a'"}},
    {"structured_outputs": {"json": 5}},
]


async def agrees_with_the_document(path: str, struct: str, bodies: list[dict]) -> None:
    """Each body must be valid under the published schema exactly when the server takes it."""
    import jsonschema

    async with serving(chat_engine()) as client:
        doc = await (await client.get("/openapi.json")).json()
        schema = {**doc["components"]["schemas"][struct], "components": doc["components"]}
        for body in bodies:
            r = await client.post(path, json=body)
            valid = jsonschema.Draft202012Validator(schema).is_valid(body)
            assert valid == (r.status == 200), (body, r.status, await r.text())


async def test_the_document_states_top_logprobs_needs_logprobs_as_the_server_enforces_it():
    """top_logprobs above 0 without logprobs: true must be refused by the document and the
    server alike, and the rest taken by both."""
    hi = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    await agrees_with_the_document(
        "/v1/chat/completions", "ChatCompletionRequest", [{**hi, **b} for b in TOP_LOGPROBS_BODIES]
    )


async def test_the_document_states_the_output_formats_the_server_takes():
    """response_format and structured_outputs: the document's schema must take exactly the
    shapes the server takes (for schemas the meta-schema and the grammar accept)."""
    for path, struct, base in (
        ("/v1/chat/completions", "ChatCompletionRequest", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", "CompletionRequest", {"prompt": "hi"}),
    ):
        await agrees_with_the_document(path, struct, [{**base, "max_tokens": 2, **b} for b in FORMAT_BODIES])


async def test_output_lengths_and_prompt_ids_are_bounded_by_the_served_context():
    """max_tokens, max_completion_tokens and a prompt's id list must be published with the
    context's room: max_model_len - 1 (a prompt takes one token at least), and a larger
    max_tokens is refused."""
    async with serving() as client:
        doc = await (await client.get("/openapi.json")).json()
        room = client.server.app[CONTEXT_KEY].max_model_len - 1
        assert (await client.post("/v1/completions", json={"prompt": [5], "max_tokens": room})).status == 200
        assert (await client.post("/v1/completions", json={"prompt": [5], "max_tokens": room + 1})).status == 400
        r = await client.post("/v1/completions", json={"prompt": [5], "max_tokens": 0})
        assert (await r.json())["error"]["message"] == "`max_tokens` must be at least 1, got 0."
    props = doc["components"]["schemas"]["CompletionRequest"]["properties"]
    for name in ("max_tokens", "max_completion_tokens"):
        assert props[name]["anyOf"][0]["maximum"] == room
    ids, batch = props["prompt"]["anyOf"][1], props["prompt"]["anyOf"][3]
    assert ids["maxItems"] == batch["items"]["maxItems"] == room
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert chat["max_tokens"]["anyOf"][0]["maximum"] == room
