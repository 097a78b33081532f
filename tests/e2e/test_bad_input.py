"""Bad requests over the real 4-rank server: each gets its status and a message naming the
problem, and the server keeps serving."""

from __future__ import annotations

import pytest

from dspark_testing.prompts import token_prompt

MAX_MODEL_LEN = 1024  # the server's default --max-model-len

CASES = [
    # (id, body, status, param, words the message must contain)
    ("malformed-json", b'{"prompt": "hi", ', 400, None, "not valid JSON"),
    ("not-an-object", b"[1, 2]", 400, None, ""),
    ("empty-body", b"", 400, None, "empty"),
    ("max-tokens-string", {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens", "max_tokens"),
    ("prompt-number", {"prompt": 42}, 400, "prompt", "prompt"),
    ("stream-string", {"prompt": "hi", "stream": "yes"}, 400, "stream", "stream"),
    ("missing-prompt", {"max_tokens": 4}, 400, "prompt", "prompt"),
    ("empty-prompt", {"prompt": ""}, 400, "prompt", "empty"),
    ("empty-id-prompt", {"prompt": []}, 400, "prompt", "empty"),
    ("id-out-of-vocab", {"prompt": [5, 99999]}, 400, "prompt", "vocabulary"),
    ("negative-max-tokens", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens", "at least 1"),
    ("zero-max-tokens", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", "at least 1"),
    ("unknown-model", {"prompt": "hi", "model": "gpt-4"}, 404, "model", "gpt-4"),
    ("temperature-negative", {"prompt": "hi", "temperature": -0.7}, 400, "temperature", ">= 0"),
    ("top-p-zero", {"prompt": "hi", "top_p": 0}, 400, "top_p", "top_p"),
    ("n-0", {"prompt": "hi", "n": 0}, 400, "n", "[1, 128]"),
    ("logprobs-21", {"prompt": "hi", "logprobs": 21}, 400, "logprobs", "[0, 20]"),
    ("repetition-penalty-0", {"prompt": "hi", "repetition_penalty": 0}, 400, "repetition_penalty", "> 0"),
    ("prompt-over-context", {"prompt": token_prompt(MAX_MODEL_LEN, seed=3)}, 400, "prompt", "maximum context length"),
    ("unknown-field", {"prompt": "hi", "frobnicate": True}, 400, "frobnicate", "frobnicate"),
]


@pytest.mark.parametrize("body,status,param,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request_gets_its_status_and_a_message(server4, body, status, param, words):
    """Each bad request must get its own status with an OpenAI error body whose message says
    what is wrong (and names the field), and must not disturb the server."""
    got, out = server4.post("/v1/completions", body)
    assert got == status, out
    err = out["error"]
    assert err["message"] and words in err["message"], err
    if param is not None:
        assert err["param"] == param, err
    assert err["type"] == "invalid_request_error"
    assert server4.get("/health")[0] == 200


def test_max_tokens_beyond_the_context_is_a_400_and_up_to_it_is_served_whole(server4):
    """max_tokens past what the context leaves after the prompt must be a 400 with the
    lengths (never cut silently); exactly what it leaves must be served whole: a prompt of
    max_model_len - 3 ids with max_tokens 3 gets exactly 3 tokens."""
    prompt = token_prompt(MAX_MODEL_LEN - 3, seed=4)
    status, out = server4.post("/v1/completions", {"prompt": prompt, "max_tokens": 10**9})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded", out
    assert (
        f"you requested {MAX_MODEL_LEN - 3 + 10**9} tokens ({MAX_MODEL_LEN - 3} in the messages"
        in (out["error"]["message"])
    )
    out = server4.complete(prompt, 3)
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 3


def test_server_keeps_serving_after_the_bad_requests(server4, solo4):
    """After every bad request above, a good one must still be answered correctly (the same
    tokens as before them)."""
    before = solo4([9, 8, 7], 3)
    for _, body, _, _, _ in CASES:
        server4.post("/v1/completions", body)
    assert server4.complete([9, 8, 7], 3)["choices"][0]["token_ids"] == before
