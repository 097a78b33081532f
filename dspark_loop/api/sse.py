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


_encode = msgspec.json.Encoder().encode


def frame(obj) -> bytes:
    return b"data: " + _encode(obj) + b"\n\n"


class SSEStream:
    def __init__(self, request: web.Request):
        self.request = request
        self.response = web.StreamResponse(status=200, headers=HEADERS)
        self.write_timeout_s = request.app.get(WRITE_TIMEOUT_KEY, 0.0)
        self._high: int | None = None  # the transport's high-water mark (bytes), once started

    async def start(self) -> None:
        await self.response.prepare(self.request)
        self._high = bound_buffers(self.request.transport)

    def _cannot_block(self, num_bytes: int) -> bool:
        """Whether writing num_bytes now returns without waiting: the transport is not paused
        and stays at or under its high-water mark after it (it pauses only above). NOTE: a
        timeout per write (a timer armed and cancelled) cost ~10% of the server's CPU at 256
        streams; only a write that may wait needs one, so a stalled client is still dropped."""
        transport = self.request.transport
        if transport is None or self._high is None:
            return False
        protocol = transport.get_protocol()
        if getattr(protocol, "writing_paused", True):
            return False
        return transport.get_write_buffer_size() + num_bytes <= self._high

    async def send(self, obj) -> None:
        """Raises ConnectionResetError (aiohttp's ClientConnectionResetError) once the
        client has gone away or stopped reading. NOTE: _write's fast path inlined: this
        runs for every stream every step."""
        data = b"data: " + _encode(obj) + b"\n\n"
        if not self.write_timeout_s or self._cannot_block(len(data)):
            await self.response.write(data)
        else:
            await self._write(data)

    async def send_error(self, body: dict) -> None:
        await self._write(frame(body))

    async def finish(self) -> None:
        await self._write(DONE)
        await self.response.write_eof()

    async def _write(self, data: bytes) -> None:
        if not self.write_timeout_s or self._cannot_block(len(data)):
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


def bound_buffers(transport) -> int | None:
    """Cap what a stalled client can make this stream hold (best effort: any transport);
    the transport's high-water mark in bytes, None when it cannot say."""
    if transport is None:
        return None
    try:
        transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, WRITE_BUFFER_BYTES)
    except (OSError, AttributeError, NotImplementedError):
        pass
    try:
        return int(transport.get_write_buffer_limits()[1])
    except (AttributeError, NotImplementedError, TypeError, IndexError):
        return None
