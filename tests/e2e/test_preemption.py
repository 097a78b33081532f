"""Preemption by recompute, forced by a tiny cache (4 pages per family), over HTTP."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from dspark_testing.prompts import token_prompt
from dspark_testing.server_process import ServerProcess, pools_full

# 118-token prompts hold one c4 page (128 tokens) each; the 11th new token needs a second
# one, and with 4 pages for 3 requests somebody must be preempted. Small prefill chunks
# keep the ring's live pages (2 per request) within the pool during prefill.
PROMPTS = [token_prompt(118, seed=50 + i) for i in range(3)]
MAX_TOKENS = 14


@pytest.fixture(scope="module")
def small_cache_server(tiny_ckpt):
    server = ServerProcess(["--model", tiny_ckpt, "--num-blocks", "4", "--max-num-batched-tokens", "64"])
    yield server
    assert server.stop() == 0


def num_preemptions(server) -> float:
    _, text = server.get("/metrics")
    line = next(ln for ln in text.splitlines() if ln.startswith("vllm:num_preemptions_total"))
    return float(line.rsplit(" ", 1)[1])


def test_preempted_requests_return_the_tokens_of_an_unconstrained_run(small_cache_server):
    """Requests that outgrow a 4-page cache together must be preempted (counted in
    vllm:num_preemptions_total) and still return exactly the tokens each gets alone,
    with no page left held afterwards."""
    server = small_cache_server
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: server.complete(p, MAX_TOKENS), PROMPTS))
    preempted = num_preemptions(server)
    assert preempted > 0, "the cache was meant to be too small for the batch"
    alone = [server.complete(p, MAX_TOKENS) for p in PROMPTS]
    assert num_preemptions(server) == preempted, "a request alone must fit without preemption"
    for t, a in zip(together, alone):
        assert t["choices"][0]["token_ids"] == a["choices"][0]["token_ids"]
        assert t["usage"]["completion_tokens"] == MAX_TOKENS
    assert pools_full(server.wait_idle())
