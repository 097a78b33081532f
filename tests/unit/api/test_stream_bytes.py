"""The bytes on the wire of a stream: the direct path (chunk events pre-encoded around a
per-stream envelope, written straight to the transport) against the general one (every
chunk a dict, msgspec-encoded and written through aiohttp), byte for byte."""

from __future__ import annotations

import asyncio
import re

from dspark_loop.api.sse import SSEStream
from dspark_loop.engine.outputs import RequestOutput
from tests.unit.api.fake_engine import FakeEngine
from tests.unit.api.harness import MODEL, serving

# texts a JSON encoder must escape, a delta with a token and no text (held back), and a finish
TEXTS = ["Hi", ' "quoted"', "\\back\nslash", "", "\u00e9t\u00e9 \u2603 \U0001f600", "\t</s>"]


def tricky_deltas(g):
    n = len(TEXTS)
    return [
        RequestOutput(
            g.request_id,
            [10 + i],
            text,
            finished=i == n - 1,
            finish_reason="length" if i == n - 1 else None,
            num_prompt_tokens=len(g.prompt_token_ids),
            num_output_tokens=i + 1,
        )
        for i, text in enumerate(TEXTS)
    ]


COMPLETION = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": len(TEXTS), "stream": True}
BODIES = [
    ("/v1/completions", COMPLETION),
    ("/v1/completions", {**COMPLETION, "return_token_ids": True}),
    ("/v1/completions", {**COMPLETION, "prompt": "hello", "echo": True, "return_token_ids": True}),
    ("/v1/completions", {**COMPLETION, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
    ("/v1/completions", {**COMPLETION, "logprobs": 1, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {**COMPLETION, "n": 2, "return_token_ids": True}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}),
]


def request_bytes(path: str, body: dict, close: bool) -> bytes:
    import json

    payload = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    return (head + ("Connection: close\r\n" if close else "") + "\r\n").encode() + payload


async def read_response(reader: asyncio.StreamReader) -> bytes:
    """One chunked response, headers and body, up to and including its last chunk."""
    data = await reader.readuntil(b"\r\n\r\n")
    while not data.endswith(b"\r\n0\r\n\r\n"):
        data += await reader.readuntil(b"\r\n")
    return data


def normalised(raw: bytes) -> bytes:
    """The bytes with what differs between two runs of one request (the date, the request's
    id, its creation second) replaced by fixed text of the same length."""
    raw = re.sub(rb"Date: [^\r]*\r\n", lambda m: b"D" * len(m.group(0)), raw)
    raw = re.sub(rb'"id":"[^"]*"', lambda m: b"I" * len(m.group(0)), raw)
    return re.sub(rb'"created":[0-9]+', lambda m: b"C" * len(m.group(0)), raw)


class CountingStream(SSEStream):
    num_direct = 0

    def write_now(self, event: bytes) -> bool:
        wrote = super().write_now(event)
        CountingStream.num_direct += wrote
        return wrote


async def wire_bytes(monkeypatch, fast: bool) -> list[bytes]:
    """Every body's response on one kept-alive connection, as raw bytes; fast: chunk events
    pre-encoded and written straight to the transport, else dicts through aiohttp."""
    import dspark_loop.api.generation.choices as choices
    import dspark_loop.api.generation.skeleton as skeleton

    monkeypatch.setattr(skeleton.Generation, "pre_encoded", fast)
    monkeypatch.setattr(CountingStream, "direct_writes", fast)
    monkeypatch.setattr(skeleton, "SSEStream", CountingStream)
    monkeypatch.setattr(choices, "SSEStream", CountingStream)
    CountingStream.num_direct = 0
    out = []
    async with serving(FakeEngine(script=tricky_deltas)) as client:
        reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
        try:
            for i, (path, body) in enumerate(BODIES):
                writer.write(request_bytes(path, body, close=i == len(BODIES) - 1))
                out.append(await read_response(reader))
            assert await reader.read() == b""  # nothing after the last response, then closed
        finally:
            writer.close()
    assert (CountingStream.num_direct > 0) == fast
    return out


async def test_the_fast_path_puts_the_same_bytes_on_the_wire_as_the_general_one(monkeypatch):
    """Every response (headers, chunked framing, each SSE event, [DONE], the last chunk) must
    be byte-identical with the fast path (pre-encoded events, direct writes) and the general
    one (a dict per chunk, msgspec, aiohttp's writer), for plain text, token ids, echo,
    continuous usage, logprobs, n > 1 and chat, all on one kept-alive connection."""
    general = await wire_bytes(monkeypatch, fast=False)
    direct = await wire_bytes(monkeypatch, fast=True)
    for (path, body), g, d in zip(BODIES, general, direct):
        assert b"data: [DONE]\n\n" in d
        assert normalised(d) == normalised(g), (path, body)
