"""SSEStream: Server-Sent Events as OpenAI clients read them.

    data: {json}\n\n   ... one per chunk
    data: {"error": {...}}\n\n   an engine failure after the headers went out
    data: [DONE]\n\n
"""
from __future__ import annotations

import msgspec
from aiohttp import web

DONE = b"data: [DONE]\n\n"
HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
           "X-Accel-Buffering": "no"}


def frame(obj) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


class SSEStream:
    def __init__(self, request: web.Request):
        self.request = request
        self.response = web.StreamResponse(status=200, headers=HEADERS)

    async def start(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, obj) -> None:
        """Raises ConnectionResetError (aiohttp's ClientConnectionResetError) once the
        client has gone away."""
        await self.response.write(frame(obj))

    async def send_error(self, body: dict) -> None:
        await self.response.write(frame(body))

    async def finish(self) -> None:
        await self.response.write(DONE)
        await self.response.write_eof()
