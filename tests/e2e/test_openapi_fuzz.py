"""Fuzz: schemathesis generates requests from /openapi.json and sends them to a real
server (1 rank, a short context so every generation is quick) with every check it has:
no answer may be a 5xx, every answer must match the document (status, content type,
headers, body schema), a body the document calls invalid must be refused, and one it
calls valid accepted unless a rule the document lists beyond its schema refuses it
(openapi_checks.py). `schemathesis run` itself (its coverage phase: boundary values,
missing fields, undeclared methods) runs once over the whole document.

Raw valid examples mostly break a rule beyond the schema (a random conversation does
not end with the user). Half the positive examples are therefore
"servable": a real prompt or conversation, the served model, neutral sampling and
max_tokens 1..4; every other field stays as generated (stop, stream, echo,
stream_options ...), so the generation paths, their 200 bodies and every SSE event
(against the chunk schemas) are fuzzed too.

NOTE: schemathesis' pytest plugin (from_fixture) reads a private pytest attribute that
pytest 9 dropped, so each route runs its own hypothesis test built from the schema.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from dspark_loop.api.openapi import ROUTES
from dspark_testing.server_process import REPO, ServerProcess
from tests.e2e.openapi_checks import accepted_unless_beyond_schema

MAX_EXAMPLES = 12  # per route and mode
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


# invalid requests: only where there is a body to break (the GET routes take no input)
CASES = [
    pytest.param(r[0], r[1], mode, id=f"{r[0].upper()} {r[1]} {name}")
    for r in ROUTES
    for mode, name in ((GenerationMode.POSITIVE, "valid"), (GenerationMode.NEGATIVE, "invalid"))
    if mode == GenerationMode.POSITIVE or r[3] is not None
]


@pytest.mark.parametrize("method,path,mode", CASES)
def test_every_generated_request_gets_a_documented_non_5xx_answer(api_schema, fuzz_server, method, path, mode):
    """Any request schemathesis derives from the document for this route must pass every
    schemathesis check: not a 5xx, matching the document, invalid bodies refused, valid
    ones accepted unless a rule the document declares beyond its schema refuses them."""
    operation = api_schema[path][method.upper()]

    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case, data):
        if mode == GenerationMode.POSITIVE and isinstance(case.body, dict) and data.draw(st.booleans()):
            make_servable(path, case.body, data)
        case.call_and_validate(
            base_url=fuzz_server.url,
            excluded_checks=[positive_data_acceptance],
            additional_checks=[accepted_unless_beyond_schema],
            timeout=120,
        )

    check()


@pytest.mark.slow  # ~1000 requests, n up to 128 choices each: 380-510 s on 2 busy CPU cores
def test_schemathesis_run_with_every_check_finds_nothing(fuzz_server):
    """`schemathesis run --checks all` over the whole document (its coverage phase: each
    field's boundary values, missing and extra fields, undeclared methods) must report no
    failure, positive_data_acceptance judged by the rules the document declares."""
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.e2e.openapi_checks", "PYTHONPATH": REPO}
    cli = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    cmd = [cli, "run", fuzz_server.url + "/openapi.json", "--checks", "all"]
    # NOTE: --checks all holds each answer to 10 s unless told; the limit is raised to the
    # request timeout: no timed assertions in the tests
    cmd += ["--exclude-checks", "positive_data_acceptance", "--phases", "coverage"]
    cmd += ["--request-timeout", "120", "--max-response-time", "120"]
    cmd += ["--max-examples", "5", "--seed", "1", "--generation-deterministic", "--no-color"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
