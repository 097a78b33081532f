"""Every malformed /v1/completions request gets its own status and a message naming the
parameter, and the server keeps serving afterwards."""

from __future__ import annotations

import json

import pytest

from tests.unit.api.harness import MODEL, serving

OK = {"model": MODEL, "prompt": "hello world", "max_tokens": 4}

# (case, raw body or dict, status, param, words the message must contain)
CASES = [
    ("malformed json", b'{"prompt": "hi",', 400, None, ["not valid JSON"]),
    ("not an object", b'["hello"]', 400, None, ["Expected `object`"]),
    ("empty body", b"", 400, None, ["empty"]),
    ("prompt missing", {"model": MODEL}, 400, "prompt", ["prompt"]),
    ("prompt empty string", {**OK, "prompt": ""}, 400, "prompt", ["empty"]),
    ("prompt empty list", {**OK, "prompt": []}, 400, "prompt", ["empty"]),
    ("prompt wrong type", {**OK, "prompt": 12}, 400, "prompt", ["prompt"]),
    ("prompt mixed list", {**OK, "prompt": [1, "a"]}, 400, "prompt", ["token ids"]),
    ("batched prompts with an empty one", {**OK, "prompt": ["a", ""]}, 400, "prompt", ["empty"]),
    ("too many choices", {**OK, "prompt": ["a"] * 9, "n": 128}, 400, "prompt", ["1024"]),
    ("token id out of vocab", {**OK, "prompt": [0, 5, 1024]}, 400, "prompt", ["1024", "vocab"]),
    ("negative token id", {**OK, "prompt": [0, -1]}, 400, "prompt", ["-1"]),
    ("max_tokens negative", {**OK, "max_tokens": -3}, 400, "max_tokens", ["at least 1"]),
    ("max_tokens zero", {**OK, "max_tokens": 0}, 400, "max_tokens", ["at least 1"]),
    ("max_tokens string", {**OK, "max_tokens": "8"}, 400, "max_tokens", ["int"]),
    ("max_tokens float", {**OK, "max_tokens": 8.5}, 400, "max_tokens", ["int"]),
    (
        "max_completion_tokens zero",
        {**OK, "max_tokens": None, "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
        ["at least 1"],
    ),
    ("unknown model", {**OK, "model": "gpt-4"}, 404, "model", ["gpt-4", "does not exist"]),
    ("temperature negative", {**OK, "temperature": -0.5}, 400, "temperature", [">= 0"]),
    ("top_p zero", {**OK, "top_p": 0}, 400, "top_p", ["(0, 1]"]),
    ("top_p above one", {**OK, "top_p": 1.5}, 400, "top_p", ["(0, 1]"]),
    ("top_k below -1", {**OK, "top_k": -5}, 400, "top_k", ["-1"]),
    ("min_p above one", {**OK, "min_p": 2}, 400, "min_p", ["[0, 1]"]),
    ("presence_penalty 3", {**OK, "presence_penalty": 3}, 400, "presence_penalty", ["[-2, 2]"]),
    ("frequency_penalty -3", {**OK, "frequency_penalty": -3}, 400, "frequency_penalty", ["[-2, 2]"]),
    ("repetition_penalty 0", {**OK, "repetition_penalty": 0}, 400, "repetition_penalty", ["> 0"]),
    ("seed past 64 bits", {**OK, "seed": 1 << 64}, 400, "seed", ["64-bit"]),
    ("n 0", {**OK, "n": 0}, 400, "n", ["[1, 128]"]),
    ("n 129", {**OK, "n": 129}, 400, "n", ["[1, 128]"]),
    ("best_of above n", {**OK, "n": 1, "best_of": 2}, 400, "best_of", ["best_of 2"]),
    ("logprobs 21", {**OK, "logprobs": 21}, 400, "logprobs", ["[0, 20]"]),
    ("logprobs negative", {**OK, "logprobs": -1}, 400, "logprobs", ["[0, 20]"]),
    ("logprobs not an int", {**OK, "logprobs": True}, 400, "logprobs", ["int"]),
    ("logit_bias", {**OK, "logit_bias": {"5": 1.0}}, 400, "logit_bias", ["not supported"]),
    ("prompt over context", {**OK, "prompt": list(range(64))}, 400, "prompt", ["64", "context"]),
    ("unknown field", {**OK, "frobnicate": True}, 400, "frobnicate", ["frobnicate"]),
    ("stop wrong type", {**OK, "stop": 5}, 400, "stop", ["stop"]),
    ("stop list of numbers", {**OK, "stop": ["a", 5]}, 400, "stop", ["stop"]),
    ("stop empty string", {**OK, "stop": ""}, 400, "stop", ["empty"]),
    ("stop too many strings", {**OK, "stop": [f"s{i}" for i in range(65)]}, 400, "stop", ["<= 64"]),
    ("stream wrong type", {**OK, "stream": "yes"}, 400, "stream", ["bool"]),
    ("stream_options unknown key", {**OK, "stream": True, "stream_options": {"x": 1}}, 400, "stream_options.x", ["x"]),
    ("speculation unknown key", {**OK, "speculation": {"bogus": 1}}, 400, "speculation.bogus", ["speculation.bogus"]),
    ("min_tokens above max_tokens", {**OK, "min_tokens": 9}, 400, "min_tokens", ["max_tokens"]),
    ("stop_token_ids out of vocab", {**OK, "stop_token_ids": [5000]}, 400, "stop_token_ids", ["5000"]),
    ("suffix", {**OK, "suffix": "tail"}, 400, "suffix", ["not supported"]),
]


@pytest.mark.parametrize("case,body,status,param,words", CASES, ids=[c[0] for c in CASES])
async def test_bad_request_gets_its_status_and_names_the_parameter(case, body, status, param, words):
    """A bad request must get a 4xx OpenAI error body whose param and message name what is
    wrong, must never reach the engine, and must leave the server serving."""
    async with serving() as client:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = await client.post("/v1/completions", data=data, headers={"Content-Type": "application/json"})
        assert r.status == status
        err = (await r.json())["error"]
        assert err["param"] == param
        assert err["type"] == "invalid_request_error"
        for w in words:
            assert w in err["message"], err["message"]
        assert client.engine.requests == []
        good = await client.post("/v1/completions", json=OK)
        assert good.status == 200


async def test_the_whole_table_in_one_session_leaves_the_server_serving():
    """Every bad request in a row on one server must not disturb a good one afterwards."""
    async with serving() as client:
        for _, body, status, _, _ in CASES:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = await client.post("/v1/completions", data=data)
            assert r.status == status
        r = await client.post("/v1/completions", json=OK)
        assert r.status == 200
        assert (await r.json())["choices"][0]["finish_reason"] == "length"
        assert len(client.engine.requests) == 1


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_past_the_context_is_a_400_with_the_lengths(field):
    """A max_tokens the request names that the context cannot hold after the prompt must be
    refused (never cut) with vLLM's message: the context, the total asked, and its parts."""
    async with serving() as client:
        body = {"model": MODEL, "prompt": list(range(50)), field: 15}
        r = await client.post("/v1/completions", json=body)
        error = (await r.json())["error"]
        assert r.status == 400 and client.engine.requests == []
        assert error["message"] == (
            "This model's maximum context length is 64 tokens. However, you requested 65 tokens "
            "(50 in the messages, 15 in the completion). Please reduce the length of the messages or completion."
        )
        assert (error["param"], error["code"]) == (field, "context_length_exceeded")


async def test_max_tokens_that_exactly_fills_the_context_is_served_whole():
    """prompt + max_tokens == max_model_len must be served with all of max_tokens."""
    async with serving() as client:
        r = await client.post("/v1/completions", json={**OK, "prompt": list(range(50)), "max_tokens": 14})
        assert r.status == 200
        assert client.engine.requests[0].params.max_tokens == 14
        assert (await r.json())["usage"]["completion_tokens"] == 14


async def test_the_default_max_tokens_is_cut_to_the_context_left():
    """Without max_tokens a completion's default (16) must shrink to what the context leaves:
    a prompt of max_model_len - 1 tokens is served with exactly one output token."""
    async with serving() as client:
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": list(range(63))})
        assert r.status == 200
        assert client.engine.requests[0].params.max_tokens == 1


async def test_greedy_values_of_sampling_knobs_are_accepted():
    """temperature 0, top_p 1, top_k -1/0, n 1, seed, user must all be accepted (greedy)."""
    async with serving() as client:
        for extra in (
            {"temperature": 0},
            {"temperature": 0.0, "top_p": 1.0},
            {"top_k": -1},
            {"top_k": 0},
            {"n": 1},
            {"seed": 7},
            {"user": "u1"},
            {"logprobs": None},
            {"stop": None},
            {"frequency_penalty": 0, "presence_penalty": 0},
        ):
            r = await client.post("/v1/completions", json={**OK, **extra})
            assert r.status == 200, (extra, await r.text())


async def test_unknown_route_and_wrong_method_answer_in_openai_error_shape():
    """404/405 from routing must still carry the OpenAI error body."""
    async with serving() as client:
        r = await client.get("/v1/completions")
        assert r.status == 405
        assert "error" in await r.json()
        r = await client.post("/v1/nothing", json={})
        assert r.status == 404
        assert "error" in await r.json()
