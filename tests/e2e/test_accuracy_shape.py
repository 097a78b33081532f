"""The seeds' accuracy request shape over HTTP: 64 prompt ids, 128 new tokens, ignore_eos."""

from __future__ import annotations

from dspark_testing.prompts import token_prompt


def test_seeds_accuracy_request_runs_to_length(server4):
    """A 64-id prompt with max_tokens 128 and ignore_eos must finish with "length" and
    report exactly 64 prompt and 128 completion tokens."""
    prompt = token_prompt(64, seed=64)
    out = server4.complete(prompt, 128)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == 128
    assert out["usage"] == {
        "prompt_tokens": 64,
        "completion_tokens": 128,
        "total_tokens": 192,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
