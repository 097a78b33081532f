"""SSEStream: Server-Sent Events as OpenAI clients read them.

    data: {json}\n\n   ... one per chunk
    data: {"error": {...}}\n\n   an engine failure after the headers went out
    data: [DONE]\n\n

A client that stops reading must not hold its request's pages for ever: the stream's
buffers are bounded (WRITE_BUFFER_BYTES in the transport and in the kernel), so a stalled
client soon blocks a write; a write blocked for app[WRITE_TIMEOUT_KEY] seconds drops the
connection and raises ConnectionResetError, which the route treats as a client that left
(its generator closes, which aborts the request and frees its pages).
"""

from __future__ import annotations

import asyncio
import logging
import socket

import msgspec
from aiohttp import web

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
WRITE_BUFFER_BYTES = 64 * 1024  # per stream, in the transport and again in the socket
WRITE_TIMEOUT_KEY = web.AppKey("stream_write_timeout_s", float)
_timeout = getattr(asyncio, "timeout", None)  # Python 3.11+: no task per write


def frame(obj) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


class SSEStream:
    def __init__(self, request: web.Request):
        self.request = request
        self.response = web.StreamResponse(status=200, headers=HEADERS)
        self.write_timeout_s = request.app.get(WRITE_TIMEOUT_KEY, 0.0)

    async def start(self) -> None:
        await self.response.prepare(self.request)
        bound_buffers(self.request.transport)

    async def send(self, obj) -> None:
        """Raises ConnectionResetError (aiohttp's ClientConnectionResetError) once the
        client has gone away or stopped reading."""
        await self._write(frame(obj))

    async def send_error(self, body: dict) -> None:
        await self._write(frame(body))

    async def finish(self) -> None:
        await self._write(DONE)
        await self.response.write_eof()

    async def _write(self, data: bytes) -> None:
        if not self.write_timeout_s:
            await self.response.write(data)
            return
        try:
            if _timeout is not None:
                async with _timeout(self.write_timeout_s):
                    await self.response.write(data)
            else:
                await asyncio.wait_for(self.response.write(data), self.write_timeout_s)
        except TimeoutError:  # asyncio's TimeoutError is the builtin one since 3.11
            peer = self.request.remote
            log.warning(
                "a stream to %s took no data for %g s (write buffer full); dropping it", peer, self.write_timeout_s
            )
            transport = self.request.transport
            if transport is not None:
                transport.abort()
            raise ConnectionResetError("the client stopped reading") from None


def bound_buffers(transport) -> None:
    """Cap what a stalled client can make this stream hold (best effort: any transport)."""
    if transport is None:
        return
    try:
        transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, WRITE_BUFFER_BYTES)
    except (OSError, AttributeError, NotImplementedError):
        pass
