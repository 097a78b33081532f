"""The production topology's shape on CPU: 16 ranks, dp4/ep16/tp4, serving correct tokens."""
from __future__ import annotations

import pytest

from tests.e2e.prompts import TEXTS, token_prompt
from tests.e2e.server import ServerProcess, pools_full, wait_gone

PROMPTS = [TEXTS[1], token_prompt(45, seed=16), [0]]
MAX_TOKENS = 6


def served_tokens(args: list[str]) -> tuple[list[list[int]], ServerProcess]:
    server = ServerProcess(args, timeout_s=600)
    try:
        return [server.complete(p, MAX_TOKENS)["choices"][0]["token_ids"] for p in PROMPTS], server
    finally:
        assert pools_full(server.wait_idle())
        assert server.stop() == 0, server.log()[-3000:]


@pytest.mark.slow
def test_sixteen_rank_dp4_ep16_tp4_serves_the_one_rank_tokens(tiny_ckpt):
    """16 ranks (4 TP groups of 4, experts over all 16) must serve exactly the tokens one
    rank serves, and leave no rank behind on shutdown."""
    one, _ = served_tokens(["--model", tiny_ckpt])
    sixteen, server = served_tokens(["--model", tiny_ckpt, "--dp", "4", "--tp", "4", "--ep", "16"])
    assert len(server.ranks) == 16
    assert sixteen == one
    assert wait_gone(server.ranks, 10) == []
