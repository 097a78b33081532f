"""The seeds' accuracy request shape over HTTP: 64 prompt ids, 128 new tokens, ignore_eos."""

from __future__ import annotations

import pytest

from dspark_testing.prompts import token_prompt


# NOTE: slow (~35 s of 4-rank decode on 2 busy cores). The default suite serves greedy requests
# to "length" on dp2/tp2/ep4 with exact completion_tokens, across 32-token pages
# (test_greedy_parity.py::test_token_id_prompt_tokens_equal_transformers_greedy[70-ids]), and
# checks the usage object of a "length" finish (tests/unit/api/generation/test_completions.py::
# test_response_is_an_openai_text_completion_with_exact_usage)
@pytest.mark.slow
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
