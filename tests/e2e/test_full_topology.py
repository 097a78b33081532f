"""The production topology's shape on CPU: 16 ranks, dp4/ep16/tp4, serving correct tokens."""

from __future__ import annotations

import pytest

from dspark_testing.prompts import TEXTS, token_prompt
from dspark_testing.server_process import ServerProcess, pools_full, wait_gone

PROMPTS = [TEXTS[1], token_prompt(45, seed=16), [0]]
MAX_TOKENS = 6


@pytest.mark.slow
def test_sixteen_rank_dp4_ep16_tp4_serves_the_one_rank_tokens(tiny_ckpt, solo1):
    """16 ranks (4 TP groups of 4, experts over all 16) must serve exactly the tokens one
    rank serves, and leave no rank behind on shutdown."""
    server = ServerProcess(["--model", tiny_ckpt, "--dp", "4", "--tp", "4", "--ep", "16"], timeout_s=600)
    try:
        assert len(server.ranks) == 16
        for p in PROMPTS:
            assert server.complete(p, MAX_TOKENS)["choices"][0]["token_ids"] == solo1(p, MAX_TOKENS)
        assert pools_full(server.wait_idle())
    finally:
        assert server.stop() == 0, server.log()[-3000:]
    assert wait_gone(server.ranks, 10) == []
