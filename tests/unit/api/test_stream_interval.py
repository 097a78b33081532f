"""--stream-interval N over the real EngineLoop (scheduler + the engine tests' scripted fake
mesh): a stream's chunks are cut every N tokens, and nothing else a client sees changes."""

from __future__ import annotations

import contextlib
from dataclasses import replace

from aiohttp.test_utils import TestClient, TestServer

from dspark_loop.api.app import create_app
from dspark_loop.engine.loop import EngineLoop
from dspark_testing.tiny_tokenizer import bos_id, tiny_tokenizer
from tests.unit.api.fake_engine import tiny_model_config
from tests.unit.api.harness import make_config, sse_events
from tests.unit.engine.factories import make_mesh, make_scheduler

BODY = {"prompt": "the quick brown fox", "max_tokens": 23, "return_token_ids": True}
USAGE = {"stream_options": {"include_usage": True}}


@contextlib.asynccontextmanager
async def serving(stream_interval: int):
    sched = make_scheduler(num_partitions=2, max_num_seqs=8)
    loop = EngineLoop(sched, make_mesh(sched), tiny_tokenizer(), stream_interval=stream_interval)
    loop.start()
    tok = tiny_tokenizer()
    model = replace(tiny_model_config(), vocab_size=tok.get_vocab_size(), bos_token_id=bos_id())
    app = create_app(loop, tok, make_config(max_model_len=sched.max_model_len), model)
    try:
        async with TestClient(TestServer(app, handler_cancellation=True)) as client:
            yield client
    finally:
        await loop.stop()


async def answers(stream_interval: int, body: dict) -> tuple[dict, list[dict], dict]:
    """(the whole answer, the stream's chunks with a choice, the stream's usage chunk)."""
    async with serving(stream_interval) as client:
        whole = await (await client.post("/v1/completions", json=body)).json()
        r = await client.post("/v1/completions", json={**body, "stream": True, **USAGE})
        events = sse_events(await r.read())
    assert events[-1] == "[DONE]"
    return whole, [e for e in events[:-1] if e["choices"]], events[-2]


def joined(chunks: list[dict]) -> tuple[str, list[int], str | None]:
    choices = [c["choices"][0] for c in chunks]
    return "".join(c["text"] for c in choices), sum((c["token_ids"] for c in choices), []), choices[-1]["finish_reason"]


async def test_a_paced_stream_carries_the_same_tokens_text_finish_and_usage():
    """At N=4 a client must receive, joined, exactly the tokens, text, finish reason and usage
    it receives at N=1, streamed and not; every chunk but the first (sent at once) and the
    last (the finish) must carry at least 4 tokens."""
    whole1, chunks1, usage1 = await answers(1, BODY)
    whole4, chunks4, usage4 = await answers(4, BODY)
    assert whole4 == {**whole1, "id": whole4["id"], "created": whole4["created"]}
    choice = whole1["choices"][0]
    assert joined(chunks1) == joined(chunks4) == (choice["text"], choice["token_ids"], choice["finish_reason"])
    assert usage4["usage"] == usage1["usage"] == whole1["usage"]
    assert whole1["usage"]["completion_tokens"] == 23
    sizes = [len(c["choices"][0]["token_ids"]) for c in chunks4]
    assert sizes[0] >= 1
    assert all(n >= 4 for n in sizes[1:-1]), sizes
    assert len(chunks4) <= 2 + (23 - 1) // 4


async def test_a_stop_string_cuts_a_paced_stream_exactly_where_it_cuts_an_unpaced_one():
    """A stop string met inside a 4-token chunk must end the text just before it, with
    finish "stop", as at N=1."""
    whole, _, _ = await answers(1, BODY)
    text = whole["choices"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip() and stop in text
    body = {**BODY, "stop": [stop]}
    whole1, chunks1, usage1 = await answers(1, body)
    whole4, chunks4, usage4 = await answers(4, body)
    assert whole1["choices"][0]["finish_reason"] == "stop"
    assert whole1["choices"][0]["text"] == text[: text.index(stop)]
    choice = whole1["choices"][0]
    assert joined(chunks4) == joined(chunks1) == (choice["text"], choice["token_ids"], "stop")
    assert whole4["choices"][0] == choice
    assert usage4["usage"] == usage1["usage"]


async def test_several_choices_are_paced_each_and_keep_their_tokens():
    """n=2 streamed at N=4: each choice's chunks must join to its tokens at N=1."""

    async def per_choice(stream_interval: int) -> dict[int, list[int]]:
        async with serving(stream_interval) as client:
            body = {**BODY, "n": 2, "temperature": 0.8, "seed": 5, "stream": True}
            r = await client.post("/v1/completions", json=body)
            events = sse_events(await r.read())
        out: dict[int, list[int]] = {0: [], 1: []}
        for e in events[:-1]:
            for c in e["choices"]:
                out[c["index"]] += c["token_ids"]
        return out

    unpaced, paced = await per_choice(1), await per_choice(4)
    assert paced == unpaced and len(paced[0]) == len(paced[1]) == 23


async def test_a_paced_chat_stream_carries_the_same_reasoning_content_and_finish():
    """/v1/chat/completions at N=4: the deltas' fields, joined, must equal N=1's."""

    async def joined_deltas(stream_interval: int) -> dict[str, str]:
        body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 17, "stream": True}
        async with serving(stream_interval) as client:
            events = sse_events(await (await client.post("/v1/chat/completions", json=body)).read())
        out: dict[str, str] = {}
        for e in events[:-1]:
            for c in e["choices"]:
                for key, value in c["delta"].items():
                    out[key] = out.get(key, "") + (value if isinstance(value, str) else repr(value))
                out["finish"] = out.get("finish", "") + (c["finish_reason"] or "")
        return out

    unpaced, paced = await joined_deltas(1), await joined_deltas(4)
    assert paced == unpaced and unpaced["finish"] == "length"
