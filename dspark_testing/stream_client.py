"""An SSE client for /v1/completions streams, as a test wants to see them.

stream = await open_stream(session, url, body)     # status checked, headers in
async for event in stream.events(): ...             # dicts, then "[DONE]"
result = await stream_completion(session, url, body)  # everything, collected
readers = await read_while_flowing(streams)           # one task each, once tokens flow on all
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

DONE = "[DONE]"


@dataclass
class StreamResult:
    events: list = field(default_factory=list)  # decoded JSON chunks and the final "[DONE]"
    first_token_s: float | None = None  # since the request was sent
    total_s: float = 0.0

    @property
    def token_ids(self) -> list[int]:
        return [t for e in self.chunks for c in e["choices"] for t in c.get("token_ids", [])]

    @property
    def text(self) -> str:
        return "".join(c["text"] for e in self.chunks for c in e["choices"])

    @property
    def chunks(self) -> list[dict]:
        return [e for e in self.events if isinstance(e, dict) and e.get("choices")]

    @property
    def errors(self) -> list[dict]:
        return [e for e in self.events if isinstance(e, dict) and "error" in e]

    @property
    def finish_reason(self) -> str | None:
        reasons = [c["finish_reason"] for e in self.chunks for c in e["choices"] if c["finish_reason"]]
        return reasons[-1] if reasons else None

    @property
    def usage(self) -> dict | None:
        usages = [e["usage"] for e in self.events if isinstance(e, dict) and e.get("usage")]
        return usages[-1] if usages else None

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == DONE


class Stream:
    def __init__(self, response: aiohttp.ClientResponse, sent_at: float):
        self.response = response
        self.sent_at = sent_at

    async def events(self):
        """Each `data:` payload (a dict, or "[DONE]") as it arrives."""
        async for raw in self.response.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            yield payload if payload == DONE else json.loads(payload)

    def close(self) -> None:
        """Drop the connection (a client that goes away mid-stream)."""
        self.response.close()


async def open_stream(session: aiohttp.ClientSession, url: str, body: dict, path: str = "/v1/completions") -> Stream:
    sent_at = time.perf_counter()
    resp = await session.post(url + path, json={**body, "stream": True})
    if resp.status != 200:
        text = await resp.text()
        resp.release()
        raise AssertionError(f"stream refused: {resp.status} {text}")
    return Stream(resp, sent_at)


async def stream_completion(
    session: aiohttp.ClientSession, url: str, body: dict, path: str = "/v1/completions"
) -> StreamResult:
    stream = await open_stream(session, url, body, path)
    result = StreamResult()
    async with stream.response:
        async for event in stream.events():
            if result.first_token_s is None and has_tokens(event):
                result.first_token_s = time.perf_counter() - stream.sent_at
            result.events.append(event)
    result.total_s = time.perf_counter() - stream.sent_at
    return result


def has_tokens(event) -> bool:
    """Whether an event is a chunk that carries tokens."""
    return isinstance(event, dict) and any(c.get("token_ids") or c.get("text") for c in event.get("choices", []))


async def read_to_end(stream: Stream, flowing: asyncio.Event | None = None) -> list:
    """Every event of the stream (dicts, then "[DONE]"), to its end; sets `flowing` once the
    first chunk with tokens is in."""
    events = []
    async for event in stream.events():
        events.append(event)
        if flowing is not None and has_tokens(event):
            flowing.set()
    return events


async def read_while_flowing(streams: list[Stream], timeout_s: float = 60.0) -> list[asyncio.Task]:
    """One task per stream reading it to its end (read_to_end's events), returned once every
    stream has delivered its first tokens: a test acts mid-stream on that event, not after a
    sleep. TimeoutError (the readers cancelled) if a stream has none within timeout_s."""
    flowing = [asyncio.Event() for _ in streams]
    readers = [asyncio.create_task(read_to_end(s, f)) for s, f in zip(streams, flowing, strict=True)]
    try:
        await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flowing)), timeout_s)
    except TimeoutError:
        for r in readers:
            r.cancel()
        raise
    return readers
