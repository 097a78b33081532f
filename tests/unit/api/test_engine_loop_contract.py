"""The API over the real EngineLoop (scheduler + the engine tests' scripted fake mesh): the
interface the FakeEngine imitates must be the one the engine really has."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dspark_loop.api.app import create_app
from dspark_loop.engine.loop import EngineLoop
from dspark_testing.tiny_tokenizer import bos_id, tiny_tokenizer
from tests.unit.api.fake_engine import tiny_model_config
from tests.unit.api.harness import make_config, sse_events
from tests.unit.engine.factories import make_mesh, make_scheduler


@pytest.fixture
async def client():
    sched = make_scheduler(num_partitions=2, max_num_seqs=8)
    loop = EngineLoop(sched, make_mesh(sched), tiny_tokenizer())
    loop.start()
    tok = tiny_tokenizer()
    model = replace(tiny_model_config(), vocab_size=tok.get_vocab_size(), bos_token_id=bos_id())
    app = create_app(loop, tok, make_config(max_model_len=sched.max_model_len), model)
    async with TestClient(TestServer(app, handler_cancellation=True)) as c:
        c.loop_engine = loop
        yield c
    await loop.stop()


def pools_empty(loop: EngineLoop) -> bool:
    loop.scheduler.check_integrity()
    return all(p.cache.usage() == 0 for p in loop.scheduler.partitions)


async def test_stream_and_whole_answers_carry_the_same_tokens(client):
    """The same greedy request streamed and not streamed must give the same text, token ids
    and usage, and leave every page free."""
    body = {"prompt": "the quick brown fox", "max_tokens": 12, "return_token_ids": True}
    whole = await (await client.post("/v1/completions", json=body)).json()
    r = await client.post("/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}})
    events = sse_events(await r.read())
    chunks = [e for e in events[:-1] if e["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert sum((c["choices"][0]["token_ids"] for c in chunks), []) == whole["choices"][0]["token_ids"]
    assert events[-2]["usage"] == whole["usage"]
    assert whole["usage"]["completion_tokens"] == 12 == len(whole["choices"][0]["token_ids"])
    assert whole["choices"][0]["finish_reason"] == "length"
    assert pools_empty(client.loop_engine)


async def test_concurrent_requests_and_a_disconnect_leave_the_pools_empty(client):
    """Concurrent requests must all finish; one abandoned mid-stream must be aborted."""
    r = await client.post("/v1/completions", json={"prompt": "hello world", "max_tokens": 200, "stream": True})
    await r.content.readuntil(b"\n\n")
    answers = await asyncio.gather(
        *(client.post("/v1/completions", json={"prompt": f"hello {i}", "max_tokens": 5 + i}) for i in range(6))
    )
    assert [(await a.json())["usage"]["completion_tokens"] for a in answers] == [5 + i for i in range(6)]
    r.close()
    for _ in range(200):
        if client.loop_engine.num_running == 0 and client.loop_engine.num_waiting == 0:
            break
        await asyncio.sleep(0.01)
    assert pools_empty(client.loop_engine)
