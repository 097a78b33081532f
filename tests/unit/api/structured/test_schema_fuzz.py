"""Arbitrary JSON at every field that carries a user's JSON Schema, through the real app:
the answer is a 200 or a 4xx naming the problem, never a 5xx."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.api.harness import serving
from tests.unit.api.scripted import chat_engine

HI = [{"role": "user", "content": "hi"}]
NO_THINKING = {"chat_template_kwargs": {"thinking": False}}  # chat only
KEYWORDS = (
    "type properties items required enum const anyOf oneOf allOf not $ref $defs definitions pattern format "
    "minimum maximum exclusiveMinimum multipleOf minLength maxLength minItems maxItems prefixItems "
    "additionalProperties patternProperties propertyNames uniqueItems contains if then dependentRequired "
    "$schema $id title description default"
).split()
DRAFTS = [
    "https://json-schema.org/draft/2020-12/schema",
    "http://json-schema.org/draft-07/schema#",
    "http://json-schema.org/draft-04/schema#",
    "http://json-schema.org/draft-03/schema#",
    "not a uri",
    "http://[",
]
TYPES = ["object", "string", "integer", "number", "boolean", "array", "null", "float"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
    | st.sampled_from(TYPES + DRAFTS + ["(", "[a-z]+", "^\\d{2}$", "#/$defs/a", "email", "date-time"])
)
any_json = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
# schema-shaped JSON: objects keyed mostly by JSON Schema keywords (two draws in three), values
# anything, schema-shaped ones included; else any JSON at all
keys = st.sampled_from(KEYWORDS) | st.text(max_size=4)
schema_objects = st.recursive(
    st.dictionaries(keys, scalars, max_size=4),
    lambda inner: st.dictionaries(keys, inner | scalars | st.lists(inner, max_size=3), max_size=5),
    max_leaves=16,
)
schemas = schema_objects | schema_objects | any_json


def tools(schema, choice="auto") -> dict:
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}], "tool_choice": choice}


FIELDS = {
    "chat response_format": ("/v1/chat/completions", lambda s: {"response_format": rf(s)}),
    "chat structured_outputs.json": ("/v1/chat/completions", lambda s: {"structured_outputs": {"json": s}}),
    "chat structured_outputs.json as text": (
        "/v1/chat/completions",
        lambda s: {"structured_outputs": {"json": json.dumps(s)}},
    ),
    "chat tools[].function.parameters": ("/v1/chat/completions", lambda s: tools(s)),
    "chat tools[].function.parameters, required": ("/v1/chat/completions", lambda s: tools(s, "required")),
    "system message tools": (
        "/v1/chat/completions",
        lambda s: {
            "messages": [{"role": "system", "content": "", "tools": tools(s)["tools"]}, *HI],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
    ),
    "completions response_format": ("/v1/completions", lambda s: {"response_format": rf(s)}),
    "completions structured_outputs.json": ("/v1/completions", lambda s: {"structured_outputs": {"json": s}}),
}


def rf(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


class AppThread:
    """The app on its own event loop in a thread, so hypothesis can drive it synchronously."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),), daemon=True)
        self.thread.start()
        assert self.ready.wait(30)

    async def _serve(self):
        self.stop = asyncio.Event()
        async with serving(chat_engine()) as client:
            self.client = client
            self.ready.set()
            await self.stop.wait()

    async def _post(self, path: str, text: str) -> tuple[int, dict]:
        r = await self.client.post(path, data=text, headers={"Content-Type": "application/json"})
        return r.status, await r.json()

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        return self.post_raw(path, json.dumps(body))

    def post_raw(self, path: str, text: str) -> tuple[int, dict]:
        return asyncio.run_coroutine_threadsafe(self._post(path, text), self.loop).result(60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)


@pytest.fixture(scope="module")
def app():
    thread = AppThread()
    yield thread
    thread.close()


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_arbitrary_json_in_a_schema_field_never_answers_5xx(field, app):
    """Whatever JSON a schema field holds, the server must answer 200 or a 4xx with an
    OpenAI error body naming a parameter, never a 5xx."""
    path, build = FIELDS[field]

    @settings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(schemas)
    def check(schema):
        status, answer = app.post(path, request(path, build(schema)))
        assert status < 500, (status, answer, schema)
        if status != 200:
            assert 400 <= status < 500 and answer["error"]["param"], answer

    check()


def request(path: str, fields: dict) -> dict:
    if path.endswith("chat/completions"):
        return {"messages": HI, "max_tokens": 4, **NO_THINKING, **fields}
    return {"prompt": "hi", "max_tokens": 4, **fields}


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_malformed_schema_is_a_400_naming_the_keyword_and_its_path(field, app):
    """The issue's example, properties: 5, must be a 400 whose message and param name the
    keyword and the JSON path to it."""
    path, build = FIELDS[field]
    status, answer = app.post(path, request(path, build({"type": "object", "properties": 5})))
    assert status == 400, answer
    assert answer["error"]["param"].endswith("properties"), answer
    assert "'properties'" in answer["error"]["message"] and "5 is not of type 'object'" in answer["error"]["message"]


def nested(depth: int) -> str:
    """A JSON Schema `depth` arrays deep, as text (too deep for json.dumps to write)."""
    return '{"type": "array", "items": ' * depth + "{}" + "}" * depth


@pytest.mark.parametrize("depth", [400, 5000])
def test_a_schema_nested_too_deeply_to_read_is_a_400(depth, app):
    """A schema nested deeper than the server reads, in the body or as structured_outputs'
    JSON text, must be a 400, not the RecursionError's 500."""
    text = nested(depth)
    in_body = json.dumps({"messages": HI, "structured_outputs": {"json": "@"}}).replace('"@"', text)
    as_text = {"messages": HI, "structured_outputs": {"json": text}}
    for body in (in_body, as_text):
        status, answer = app.post_raw("/v1/chat/completions", body if isinstance(body, str) else json.dumps(body))
        assert status == 400, answer
