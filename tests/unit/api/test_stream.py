"""/v1/completions with stream=true: exact SSE framing, usage chunk, errors, disconnects."""

from __future__ import annotations

import asyncio

import pytest

from dspark_loop.engine.outputs import RequestOutput
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.fake_engine import FakeEngine, reply_ids
from tests.unit.api.harness import MODEL, serving, sse_events

STREAM = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 3, "stream": True}


def endless_reply(g):
    tok = tiny_tokenizer()
    for i in range(10**6):
        yield RequestOutput(g.request_id, [65], tok.decode([65]), num_output_tokens=i + 1)


async def test_stream_frames_are_exact_and_end_with_done():
    """Each delta must be one `data: {json}\\n\\n` frame with finish_reason null until the
    last, then `data: [DONE]\\n\\n`, with the SSE content type."""
    async with serving() as client:
        r = await client.post("/v1/completions", json=STREAM)
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = await r.read()
        assert raw.endswith(b"\n\ndata: [DONE]\n\n")
        events = sse_events(raw)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        tok = tiny_tokenizer()
        assert [c["choices"][0]["text"] for c in chunks] == [tok.decode([t]) for t in reply_ids()[:3]]
        assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
        assert {c["id"] for c in chunks} == {client.engine.requests[0].request_id}
        assert all(c["object"] == "text_completion" and c["model"] == MODEL for c in chunks)
        assert all("usage" not in c for c in chunks)


async def test_include_usage_adds_one_usage_chunk_with_no_choices_before_done():
    """stream_options.include_usage must add a final chunk with choices [] and exact usage."""
    async with serving() as client:
        r = await client.post("/v1/completions", json={**STREAM, "stream_options": {"include_usage": True}})
        events = sse_events(await r.read())
        usage_chunk = events[-2]
        assert usage_chunk["choices"] == []
        assert usage_chunk["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 3,
            "total_tokens": 6,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        assert all("usage" not in e for e in events[:-2])


async def test_stream_echo_and_token_ids_arrive_in_chunks():
    """echo must send the prompt text first; return_token_ids must carry prompt_token_ids once
    and each chunk's token_ids, which concatenate to all output tokens."""
    async with serving() as client:
        r = await client.post(
            "/v1/completions", json={**STREAM, "prompt": "hello", "echo": True, "return_token_ids": True}
        )
        chunks = sse_events(await r.read())[:-1]
        assert chunks[0]["choices"][0]["text"] == "hello"
        assert chunks[0]["choices"][0]["prompt_token_ids"] == client.engine.requests[0].prompt_token_ids
        assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
        assert sum((c["choices"][0]["token_ids"] for c in chunks), []) == reply_ids()[:3]


async def test_engine_error_after_headers_is_an_error_event_then_done():
    """A failure after the first delta must go out as `data: {"error": ...}` then [DONE]."""

    def script(g):
        return [
            RequestOutput(g.request_id, [9], "a", num_output_tokens=1),
            RequestOutput(g.request_id, [], "", finished=True, finish_reason="error", error="rank 3 failed the step"),
        ]

    async with serving(FakeEngine(script=script)) as client:
        r = await client.post("/v1/completions", json={**STREAM, "stream_options": {"include_usage": True}})
        assert r.status == 200
        events = sse_events(await r.read())
        assert events[0]["choices"][0]["text"] == "a"
        assert "rank 3 failed the step" in events[1]["error"]["message"]
        assert events[1]["error"]["type"] == "server_error"
        assert events[-1] == "[DONE]"


async def test_engine_error_before_any_token_is_a_plain_http_error():
    """A request the engine fails at once must get a JSON 500, not a 200 stream."""

    def script(g):
        return [RequestOutput(g.request_id, [], "", finished=True, finish_reason="error", error="cannot schedule")]

    async with serving(FakeEngine(script=script)) as client:
        r = await client.post("/v1/completions", json=STREAM)
        assert r.status == 500
        assert "cannot schedule" in (await r.json())["error"]["message"]


async def test_held_back_text_sends_no_empty_chunks():
    """Deltas with tokens but no text yet (stop-string holdback) must not produce chunks."""

    def script(g):
        return [
            RequestOutput(g.request_id, [5], "", num_output_tokens=1),
            RequestOutput(g.request_id, [6], "ab", num_output_tokens=2),
            RequestOutput(
                g.request_id, [7], "", finished=True, finish_reason="stop", stop_reason="c", num_output_tokens=3
            ),
        ]

    async with serving(FakeEngine(script=script)) as client:
        events = sse_events(await (await client.post("/v1/completions", json=STREAM)).read())
        assert [(e["choices"][0]["text"], e["choices"][0]["finish_reason"]) for e in events[:-1]] == [
            ("ab", None),
            ("", "stop"),
        ]
        assert events[1]["choices"][0]["stop_reason"] == "c"


@pytest.mark.parametrize("handler_cancellation", [True, False])
async def test_client_disconnect_mid_stream_closes_the_engine_generator(handler_cancellation):
    """A client that goes away mid-stream must make the API close the engine's generator
    (aborting the request), whether aiohttp cancels the handler or the next write fails."""
    engine = FakeEngine(delay_s=0.01, script=endless_reply)
    async with serving(engine, handler_cancellation=handler_cancellation) as client:
        r = await client.post("/v1/completions", json={**STREAM, "max_tokens": 40})
        await r.content.readuntil(b"\n\n")  # one chunk arrived
        r.close()  # drop the connection
        await asyncio.wait_for(engine.closed.wait(), 5)
        assert engine.aborted == [engine.requests[0].request_id]
        assert engine.num_running == 0


async def test_client_disconnect_while_engine_is_silent_aborts_at_once():
    """With handler cancellation (as serve() runs), a client leaving while the engine has no
    token for it must still abort the request."""
    engine = FakeEngine(script=lambda g: [], hang=True)
    async with serving(engine) as client:
        task = asyncio.create_task(client.post("/v1/completions", json={**STREAM, "stream": False}))
        while not engine.requests:
            await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.wait_for(engine.closed.wait(), 5)
        assert engine.aborted == [engine.requests[0].request_id]
