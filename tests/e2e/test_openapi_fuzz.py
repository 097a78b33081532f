"""Fuzz: schemathesis generates requests from /openapi.json and sends them to a real
server (1 rank, a short context so every generation is quick): no answer may be a 5xx,
and every answer must match the document (status, content type, body schema).

The document types `prompt` and `messages` as any JSON (prompt.py and chat_validate.py
check them), so raw examples are nearly all 400s. Half the examples are therefore
"servable": a real prompt or conversation, the served model, neutral sampling and
max_tokens 1..4; every other field stays as generated (stop, stream, echo,
stream_options ...), so the generation paths, their 200 bodies and every SSE event
(against the chunk schemas) are fuzzed too.

NOTE: schemathesis' pytest plugin (from_fixture) reads a private pytest attribute that
pytest 9 dropped, so each route runs its own hypothesis test built from the schema.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from dspark_loop.api.openapi import ROUTES
from dspark_testing.server_process import ServerProcess

MAX_EXAMPLES = 20  # per route
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "n",
    "best_of",
    "logprobs",
    "top_logprobs",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "suffix",
    "tools",
    "tool_choice",
    "response_format",
    "thinking",
    "min_tokens",
)
TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)
TOKENS = st.lists(st.integers(2, 1023), min_size=1, max_size=20)


def make_servable(path: str, body: dict, data) -> None:
    """Turn a generated body into one the server can run (see the module's note)."""
    body.pop("model", None)
    for key in SAMPLING + ("max_completion_tokens",):
        body.pop(key, None)
    if path.startswith("/v1/"):
        body["max_tokens"] = data.draw(st.integers(1, 4))  # short: the machine is shared
        body["stream"] = data.draw(st.booleans())
    if path == "/v1/completions":
        body["prompt"] = data.draw(st.one_of(TEXT, TOKENS, st.lists(TOKENS, min_size=1, max_size=1)))
    elif path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": data.draw(TEXT)}]
    elif path == "/tokenize":
        body.pop("text", None)
        body["prompt"] = data.draw(TEXT)
    elif path == "/detokenize":
        body["tokens"] = data.draw(TOKENS)


@pytest.fixture(scope="module")
def fuzz_server(tiny_ckpt):
    server = ServerProcess(["--model", tiny_ckpt, "--max-model-len", "64"])
    yield server
    assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")


@pytest.mark.parametrize("method,path", [(r[0], r[1]) for r in ROUTES], ids=[f"{r[0].upper()} {r[1]}" for r in ROUTES])
def test_every_generated_request_gets_a_documented_non_5xx_answer(api_schema, fuzz_server, method, path):
    """Any request schemathesis derives from the document for this route must get an
    answer that is not a 5xx and that matches the document."""
    operation = api_schema[path][method.upper()]

    @given(case=operation.as_strategy(), data=st.data())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case, data):
        if isinstance(case.body, dict) and data.draw(st.booleans(), label="servable"):
            make_servable(path, case.body, data)
        case.call_and_validate(base_url=fuzz_server.url, checks=CHECKS, timeout=120)

    check()
