"""Many streams at once over the 4-rank server: batching must not change any token, and
a client that leaves must give its pages back."""

from __future__ import annotations

import asyncio

from dspark_testing.prompts import mixed_prompts, token_prompt
from dspark_testing.server_process import pools_full
from dspark_testing.stream_client import open_stream, stream_completion

NUM_STREAMS = 32
PROMPTS = mixed_prompts(8)  # lengths 1, 38, 75, ... 260 -> pages, windows, ratios
MAX_TOKENS = (2, 4, 6, 8)  # each prompt is sent once with each


async def test_concurrent_streams_each_equal_their_solo_result(server4, solo4, http):
    """32 streams of mixed prompt and output lengths, sent at once, must each stream exactly
    the tokens the same prompt gets when served alone, finish with "length" and end [DONE]."""
    solo = {i: solo4(p, max(MAX_TOKENS)) for i, p in enumerate(PROMPTS)}
    jobs = [(i, n) for n in MAX_TOKENS for i in range(len(PROMPTS))]
    assert len(jobs) == NUM_STREAMS
    bodies = [{"prompt": PROMPTS[i], "max_tokens": n, "ignore_eos": True, "return_token_ids": True} for i, n in jobs]
    results = await asyncio.gather(*(stream_completion(http, server4.url, b) for b in bodies))
    for (i, n), r in zip(jobs, results):
        assert r.errors == [] and r.done
        assert r.token_ids == solo[i][:n], f"prompt {i} ({len(PROMPTS[i])} tokens), max_tokens {n}"
        assert r.finish_reason == "length"
    stats = await asyncio.to_thread(server4.wait_idle)
    assert pools_full(stats), stats


async def test_disconnected_stream_frees_its_pages(server4, http):
    """A client that drops a stream mid-generation must have its request aborted: the pools
    must return to full within seconds (long before 500 tokens could have been generated)
    and the abort must be counted."""
    before = server4.metrics_json()["request_success_total"]["abort"]
    stream = await open_stream(
        http, server4.url, {"prompt": token_prompt(90, seed=5), "max_tokens": 500, "ignore_eos": True}
    )
    got = 0
    async for _event in stream.events():
        got += 1
        if got == 2:
            break
    held = server4.engine_stats()
    assert held["num_requests"] == 1 and not pools_full(held), held
    stream.close()
    # NOTE: off the event loop: the socket only really closes when this loop runs.
    stats = await asyncio.to_thread(server4.wait_idle, 10)
    assert pools_full(stats), stats
    # NOTE: an abort between steps reaches the observers with the next step.
    await asyncio.to_thread(server4.complete, [3, 4], 1)
    assert server4.metrics_json()["request_success_total"]["abort"] == before + 1
