"""EngineLoop.cache_stats(): the per-partition load a router reads (api/server_info.py)."""

import asyncio

from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.engine.factories import make_mesh, make_scheduler, prompt_ids

PROMPT_LEN = 8


async def test_cache_stats_count_the_tokens_live_requests_hold_and_those_waiting_ones_still_need():
    """With one request running and two waiting, a partition's num_tokens must be every live
    request's prompt plus its output so far, num_waiting_tokens the waiting prompts (nothing
    computed yet); once all are done both must be 0."""
    sched = make_scheduler(max_num_seqs=1)
    loop = EngineLoop(sched, make_mesh(sched), tiny_tokenizer())
    loop.start()
    gens = [
        loop.generate(GenerateRequest(f"r{i}", prompt_ids(i, PROMPT_LEN), SamplingParams(max_tokens=40)))
        for i in range(3)
    ]
    try:
        firsts = [asyncio.ensure_future(g.__anext__()) for g in gens]
        await firsts[0]
        part = loop.cache_stats()["partitions"][0]
        running = sched.requests["r0"]
        assert (part["num_running"], part["num_waiting"]) == (1, 2)
        assert part["num_waiting_tokens"] == 2 * PROMPT_LEN
        assert part["num_tokens"] == 3 * PROMPT_LEN + len(running.output_ids) and running.output_ids
        for first, g in zip(firsts, gens):
            out = await first
            while not out.finished:
                out = await g.__anext__()
        part = loop.cache_stats()["partitions"][0]
        assert (part["num_tokens"], part["num_waiting_tokens"]) == (0, 0)
    finally:
        for g in gens:
            await g.aclose()
        await loop.stop()
