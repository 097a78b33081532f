"""Request's token views: prompt + outputs without building the whole list."""

from __future__ import annotations

import numpy as np

from dspark_loop.engine.finish_rules import FinishRules
from dspark_loop.engine.outputs import SamplingParams
from dspark_loop.engine.request import Request


def test_token_bytes_and_token_at_equal_the_int32_token_list_for_every_span():
    prompt = [5, 70000, 3, 2**31 - 1, 9]
    req = Request(
        "r", prompt, SamplingParams(max_tokens=8), FinishRules(eos_token_ids=(1,), max_tokens=8, max_model_len=64)
    )
    req.output_ids.extend([11, 2**20, 0, 7])
    tokens = np.array(prompt + req.output_ids, np.int32)
    n = len(tokens)
    for start in range(n + 1):
        for end in range(start, n + 1):
            assert req.token_bytes(start, end) == tokens[start:end].tobytes(), (start, end)
    assert [req.token_at(i) for i in range(n)] == tokens.tolist()
    assert all(type(req.token_at(i)) is int for i in range(n))
