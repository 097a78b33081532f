"""response_format / structured_outputs at the routes: which requests get a JSON grammar,
what it allows, and the 400s (naming the field) before anything is generated."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dspark_loop.api.structured.output_format import output_format
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.harness import serving
from tests.unit.api.scripted import chat_engine

HI = [{"role": "user", "content": "hi"}]
NO_THINKING = {"chat_template_kwargs": {"thinking": False}}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def first_allowed_text(constraint) -> list[str]:
    tok = tiny_tokenizer()
    return [tok.decode([int(i)]) for i in np.flatnonzero(constraint.allowed_token_mask([]))]


def walk(constraint, text: str) -> bool:
    """Whether the constraint accepts `text` (as the tiny tokenizer splits it) then EOS."""
    tok = tiny_tokenizer()
    ids = tok.encode(text, add_special_tokens=False).ids + [tok.token_to_id("<｜end▁of▁sentence｜>")]
    return all(constraint.accept(t) for t in ids) and constraint.is_terminated()


@pytest.mark.parametrize(
    "body",
    [
        {"response_format": SCHEMA_FORMAT},
        {"response_format": {"type": "json_object"}},
        {"structured_outputs": {"json": PERSON}},
        {"structured_outputs": {"json": json.dumps(PERSON)}},
        {"structured_outputs": {"json_object": True}},
    ],
)
async def test_json_formats_attach_a_grammar_that_starts_a_json_object(body):
    """Each JSON spelling (response_format json_schema / json_object, vLLM's
    structured_outputs json / json_object) must give the engine a constraint whose first
    mask allows only the start of an object."""
    async with serving(chat_engine()) as client:
        r = await client.post("/v1/chat/completions", json={"messages": HI, **body, **NO_THINKING})
        assert r.status == 200, await r.text()
        constraint = client.engine.requests[0].constraint
    allowed = first_allowed_text(constraint)
    assert allowed and all(t.startswith("{") for t in allowed)


async def test_a_json_schema_grammar_admits_valid_documents_and_refuses_invalid_ones():
    """The compiled grammar must accept a document of the schema and refuse one that breaks
    maxLength, minimum or required."""
    async with serving(chat_engine()) as client:
        for _ in range(5):
            await client.post(
                "/v1/chat/completions", json={"messages": HI, "response_format": SCHEMA_FORMAT, **NO_THINKING}
            )
        cs = [g.constraint for g in client.engine.requests]
    assert walk(cs[0], '{"name": "Ann", "age": 3}')
    assert not walk(cs[1], '{"name": "Annabelle!", "age": 3}')
    assert not walk(cs[2], '{"name": "Ann", "age": -3}')
    assert not walk(cs[3], '{"name": "Ann"}')


async def test_regex_and_choice_grammars_admit_exactly_their_texts():
    """structured_outputs regex must admit exactly the texts the pattern matches, and choice
    exactly one of its strings (punctuation in a choice is literal), on both routes."""
    odd = "a.b*(c)|d?"
    cases = [
        ({"regex": "[a-z]+-[0-9]{2}"}, ["ab-12", "x-00"], ["ab-1", "AB-12", "ab-123"]),
        ({"choice": ["yes", "no", odd]}, ["yes", "no", odd], ["maybe", "yesno", "a", "abc", ""]),
    ]
    async with serving(chat_engine()) as client:
        for so, good, bad in cases:
            for route, body in (
                ("/v1/chat/completions", {"messages": HI, **NO_THINKING}),
                ("/v1/completions", {"prompt": "hi"}),
            ):
                for text in good + bad:
                    r = await client.post(route, json={**body, "max_tokens": 4, "structured_outputs": so})
                    assert r.status == 200, await r.text()
                    assert walk(client.engine.requests[-1].constraint, text) == (text in good), (so, route, text)


async def test_a_json_string_never_takes_a_special_token_that_the_text_would_drop():
    """Inside a JSON string any text is valid, but a placeholder or a turn marker is a
    special token the answer's text drops: the grammar must refuse it (an ordinary token
    it allows)."""
    tok = tiny_tokenizer()
    async with serving(chat_engine()) as client:
        await client.post(
            "/v1/chat/completions", json={"messages": HI, "response_format": SCHEMA_FORMAT, **NO_THINKING}
        )
        constraint = client.engine.requests[0].constraint
    mask = constraint.allowed_token_mask(tok.encode('{"name": "', add_special_tokens=False).ids)
    assert mask[tok.encode("A", add_special_tokens=False).ids[0]]
    for special in ("<｜place▁holder▁no▁799｜>", "<｜Assistant｜>", "<｜User｜>"):
        assert not mask[tok.token_to_id(special)], special


async def test_completions_take_structured_outputs_and_response_format():
    """/v1/completions must constrain with structured_outputs.json and response_format."""
    async with serving(chat_engine()) as client:
        for body in ({"structured_outputs": {"json": PERSON}}, {"response_format": {"type": "json_object"}}):
            r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, **body})
            assert r.status == 200, await r.text()
        assert all(g.constraint is not None for g in client.engine.requests)


BAD = [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
        "response_format.json_schema.name",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
        "response_format.json_schema.schema",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}},
        "response_format.json_schema.schema.type",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(["}},
            }
        },
        "response_format.json_schema.schema",
    ),
    ({"structured_outputs": {"grammar": "root ::= 'a'"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"regex": "(["}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": ""}}, "structured_outputs.regex"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["a", 5]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["a"], "regex": "a"}}, "structured_outputs"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
]


@pytest.mark.parametrize("body, param", BAD, ids=[p for _, p in BAD])
async def test_bad_formats_are_a_400_naming_the_field_before_generation(body, param):
    """An unknown type, a missing name, a schema keyword the grammar would skip, a schema
    xgrammar cannot compile, an unsupported structured_outputs kind, or a forced-token
    option must answer 400 naming the field, and the engine must not be called."""
    async with serving(chat_engine()) as client:
        r = await client.post("/v1/chat/completions", json={"messages": HI, **body})
        out = await r.json()
        assert client.engine.requests == []
    assert r.status == 400, out
    assert out["error"]["param"] == param


def test_text_and_absent_formats_are_free_text():
    """response_format text (or none) must not constrain anything."""
    assert output_format({"type": "text"}) is None and output_format(None) is None


async def test_thinking_requests_reason_freely_then_write_the_document():
    """In thinking mode the first mask must allow any token but EOS (the reasoning), and the
    grammar must start after </think>."""
    tok = tiny_tokenizer()
    eos = tok.token_to_id("<｜end▁of▁sentence｜>")
    async with serving(chat_engine()) as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"messages": HI, "response_format": SCHEMA_FORMAT, "chat_template_kwargs": {"thinking": True}},
        )
        assert r.status == 200
        c = client.engine.requests[0].constraint
    mask = c.allowed_token_mask([])
    assert not mask[eos] and mask.sum() == len(mask) - 1
    assert walk(c, 'hmm</think>{"name": "Al", "age": 1}')
