"""Structured output through the official openai client against served K=0 and K=7 servers:
response_format json_schema / json_object, .parse() with a pydantic model, constrained tool
calls, and the 400s. Tiny random checkpoints write garbage under the grammar, so the schemas
are small (enums, bounded numbers) and validity is asserted where finish_reason is "stop"
(with at least some that stop); K=7 must give K=0's answer exactly."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from dspark_testing.server_process import ServerProcess

NO_THINKING = {"chat_template_kwargs": {"thinking": False}}
SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog", "fox"]},
        "size": {"type": "integer", "minimum": 0, "maximum": 20},
        "owner": {
            "type": "object",
            "properties": {"name": {"enum": ["ann", "bob"]}, "vip": {"type": "boolean"}},
            "required": ["name"],
        },
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["kind", "size", "owner"],
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
QUESTIONS = [f"Describe pet number {i} as JSON." for i in range(6)]
TOOL = {
    "type": "function",
    "function": {
        "name": "book",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Oslo"]},
                "nights": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["city", "nights"],
        },
    },
}


class Owner(BaseModel):
    name: Literal["ann", "bob"]
    vip: bool


class Pet(BaseModel):
    kind: Literal["cat", "dog", "fox"]
    size: int = Field(ge=0, le=20)
    owner: Owner


@pytest.fixture(scope="module")
def servers(drafter_ckpt):
    k0 = ServerProcess(["--model", drafter_ckpt], wait=False)
    k7 = ServerProcess(
        ["--model", drafter_ckpt, "--speculative-config", '{"method":"dspark","num_speculative_tokens":7}'],
        wait=False,
    )
    k0.wait_ready()
    k7.wait_ready()
    yield {0: k0, 7: k7}
    for s in (k0, k7):
        assert s.stop() == 0, s.log()[-4000:]


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def ask(server, question: str, **kw):
    c = client(server)
    return c.chat.completions.create(
        model=c.models.list().data[0].id,
        messages=[{"role": "user", "content": question}],
        max_tokens=kw.pop("max_tokens", 80),
        extra_body={**NO_THINKING, **kw.pop("extra_body", {})},
        **kw,
    )


def ask_all(server, questions: list[str], **kw) -> list:
    """Each question's first choice, the questions sent at once (the server batches them:
    batching changes no token, tests/e2e/test_concurrency.py)."""
    with ThreadPoolExecutor(len(questions)) as pool:
        return [out.choices[0] for out in pool.map(lambda q: ask(server, q, **kw), questions)]


def test_json_schema_answers_validate_and_k7_equals_k0(servers):
    """response_format json_schema (nested object, array, enums, required fields) must give
    content that parses and validates against the schema whenever it stops, at K=0 and K=7,
    with K=7's answer equal to K=0's; some answers must complete."""
    answers = {k: ask_all(servers[k], QUESTIONS, response_format=FORMAT) for k in (0, 7)}
    assert [(a.message.content, a.finish_reason) for a in answers[7]] == [
        (a.message.content, a.finish_reason) for a in answers[0]
    ]
    stopped = [a for a in answers[0] if a.finish_reason == "stop"]
    assert stopped
    for a in stopped:
        jsonschema.validate(json.loads(a.message.content), SCHEMA)
    for a in answers[0]:
        if a.finish_reason == "length":  # honest: a cut-off document does not parse
            with pytest.raises(ValueError):
                jsonschema.validate(json.loads(a.message.content), SCHEMA)


def test_a_stream_carries_the_same_document(servers):
    """A streamed json_schema answer must concatenate to the non-stream content and finish
    with the same reason."""
    for k in (0, 7):
        c = client(servers[k])
        whole = ask(servers[k], QUESTIONS[0], response_format=FORMAT).choices[0]
        stream = c.chat.completions.create(
            model=c.models.list().data[0].id,
            messages=[{"role": "user", "content": QUESTIONS[0]}],
            max_tokens=80,
            response_format=FORMAT,
            stream=True,
            extra_body=NO_THINKING,
        )
        chunks = [ch for ch in stream if ch.choices]
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == whole.message.content
        assert chunks[-1].choices[0].finish_reason == whole.finish_reason


# NOTE: slow: the client's parse() sends a json_schema response_format, the server path of
# test_json_schema_answers_validate_and_k7_equals_k0 (default), which checks K=7 equals K=0
# and that the completed documents validate
@pytest.mark.slow
def test_parse_with_a_pydantic_model(servers):
    """client.chat.completions.parse(response_format=PydanticModel) must return the parsed
    model for an answer that completes, at K=0 and K=7 alike."""
    parsed = {}
    for k in (0, 7):
        c = client(servers[k])
        got = []
        for q in QUESTIONS:
            try:
                out = c.chat.completions.parse(
                    model=c.models.list().data[0].id,
                    messages=[{"role": "user", "content": q}],
                    response_format=Pet,
                    max_tokens=80,
                    extra_body=NO_THINKING,
                )
            except openai.LengthFinishReasonError:
                got.append(None)
                continue
            assert isinstance(out.choices[0].message.parsed, Pet)
            got.append(out.choices[0].message.parsed)
        parsed[k] = got
    assert parsed[7] == parsed[0] and any(p is not None for p in parsed[0])


def test_json_object_gives_a_json_object(servers):
    """response_format json_object must give content that is a JSON object when it stops."""
    outs = ask_all(servers[7], QUESTIONS, response_format={"type": "json_object"}, max_tokens=60)
    for a in outs:
        if a.finish_reason == "stop":
            assert isinstance(json.loads(a.message.content), dict)


def test_choice_and_regex_answers_match_and_k7_equals_k0(servers):
    """structured_outputs choice must answer exactly one of its strings and regex a text the
    pattern matches whenever it stops, the same at K=7 as at K=0."""
    choice, pattern = ["cat", "dog", "a fish"], "[A-Z][a-z]{2,6}( [0-9]{1,3})?"
    for so, ok in (({"choice": choice}, lambda t: t in choice), ({"regex": pattern}, re.compile(pattern).fullmatch)):
        answers = {k: ask_all(servers[k], QUESTIONS, extra_body={"structured_outputs": so}) for k in (0, 7)}
        got = {k: [(a.message.content, a.finish_reason) for a in answers[k]] for k in (0, 7)}
        assert got[7] == got[0]
        assert all(ok(text) for text, reason in got[0] if reason == "stop") and any(r == "stop" for _, r in got[0])


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
        {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": SCHEMA}},
    ],
)
def test_bad_schemas_are_a_400(servers, fmt):
    """A schema keyword the grammar cannot enforce, a schema xgrammar cannot compile, or a
    bad name must raise BadRequestError (400) in the client."""
    with pytest.raises(openai.BadRequestError):
        ask(servers[0], QUESTIONS[0], response_format=fmt)


def test_constrained_tool_calls_at_k7_equal_k0(servers):
    """tool_choice required must give a valid call of the declared tool, the same at K=7 as
    at K=0 (the DSML block of one call is ~85 tiny-tokenizer tokens)."""
    calls = {}
    for k in (0, 7):
        outs = ask_all(
            servers[k], QUESTIONS[:3], tools=[TOOL], tool_choice="required", parallel_tool_calls=False, max_tokens=300
        )
        calls[k] = [
            (o.finish_reason, [(t.function.name, t.function.arguments) for t in o.message.tool_calls or []])
            for o in outs
        ]
    assert calls[7] == calls[0]
    done = [c for reason, c in calls[0] if reason == "tool_calls"]
    assert done
    for call in done:
        for name, args in call:
            assert name == "book"
            jsonschema.validate(json.loads(args), TOOL["function"]["parameters"])
