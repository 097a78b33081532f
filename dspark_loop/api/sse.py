"""SSEStream: Server-Sent Events as OpenAI clients read them.

    data: {json}\n\n   ... one per chunk
    data: {"error": {...}}\n\n   an engine failure after the headers went out
    data: [DONE]\n\n

A client that stops reading must not hold its request's pages for ever: the stream's
buffers are bounded (WRITE_BUFFER_BYTES in the transport and in the kernel), so a stalled
client soon blocks a write; a write blocked for app[WRITE_TIMEOUT_KEY] seconds drops the
connection and raises ConnectionResetError, which the route treats as a client that left
(its generator closes, which aborts the request and frees its pages).

Two ways an event reaches the socket, the same bytes either way:
- write_now(event), synchronous: straight to the transport, framed as HTTP/1.1 chunked
  transfer (`<len hex>\r\n<event>\r\n`) exactly as aiohttp frames it, when that cannot
  wait (the response's headers are out, the transport is not paused and stays at or under
  its high-water mark). It returns False otherwise, and the caller awaits write(event).
- write(event): through aiohttp's StreamResponse, under the write timeout when it may wait.
NOTE: write_now is the per-stream, per-step path at 256 streams: aiohttp's four layers
(StreamResponse.write, StreamWriter.write, the chunk framing, _writelines) and their
coroutine cost ~2/3 as much as the socket write itself. It keeps aiohttp's byte counters
(buffer_size, which paces aiohttp's own drain, and output_size, the access log's) as a
write through aiohttp would.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.http import StreamWriter

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
WRITE_BUFFER_BYTES = 64 * 1024  # per stream, in the transport and again in the socket
WRITE_TIMEOUT_KEY = web.AppKey("stream_write_timeout_s", float)
_timeout = getattr(asyncio, "timeout", None)  # Python 3.11+: no task per write


encode_json = msgspec.json.Encoder().encode


def frame(obj) -> bytes:
    return b"data: " + encode_json(obj) + b"\n\n"


class SSEStream:
    direct_writes = True  # False: every event through aiohttp (the reference the tests compare with)

    def __init__(self, request: web.Request):
        self.request = request
        self.response = web.StreamResponse(status=200, headers=HEADERS)
        self.write_timeout_s = request.app.get(WRITE_TIMEOUT_KEY, 0.0)
        self._high: int | None = None  # the transport's high-water mark (bytes), once started
        # the direct path, once open (after the first write, which carries the headers); Any:
        # write_now reads them only when _transport is set, and they are all set together
        self._transport: Any = None  # asyncio.Transport
        self._protocol: Any = None  # aiohttp's RequestHandler: writing_paused
        self._writer: Any = None  # aiohttp's StreamWriter: its byte counters
        self._chunked = True

    async def start(self) -> None:
        await self.response.prepare(self.request)
        self._high = bound_buffers(self.request.transport)

    def write_now(self, event: bytes) -> bool:
        """Write one event now if that cannot wait (see the module's note); False: it was not
        written, await write(event). Raises ConnectionResetError once the client is gone."""
        transport = self._transport
        if transport is None:
            return False
        if transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        data = b"%x\r\n%b\r\n" % (len(event), event) if self._chunked else event
        size = len(data)
        if self._protocol.writing_paused or transport.get_write_buffer_size() + size > self._high:
            return False
        transport.write(data)
        writer = self._writer
        writer.buffer_size += size
        writer.output_size += size
        return True

    async def send(self, obj) -> None:
        """Raises ConnectionResetError (aiohttp's ClientConnectionResetError) once the
        client has gone away or stopped reading."""
        data = frame(obj)
        if not self.write_now(data):
            await self.write(data)

    async def send_error(self, body: dict) -> None:
        await self.write(frame(body))

    async def finish(self) -> None:
        await self.write(DONE)
        await self.response.write_eof()

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

    async def write(self, data: bytes) -> None:
        """data through aiohttp, under the write timeout when the write may wait."""
        if not self.write_timeout_s or self._cannot_block(len(data)):
            await self.response.write(data)
        else:
            await self._write_or_drop(data)
        if self._transport is None and self.direct_writes:
            self._open_direct()

    async def _write_or_drop(self, data: bytes) -> None:
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

    def _open_direct(self) -> None:
        """After a write through aiohttp (the headers are out): write_now may write to the
        transport itself when aiohttp would only frame (no compression, no declared length)."""
        writer, transport = self.request.writer, self.request.transport
        if (
            transport is None
            or self._high is None
            or not isinstance(writer, StreamWriter)
            or writer.length is not None
            or writer.on_body_write is not None
            or self.response.compression
        ):
            return
        self._transport, self._protocol, self._writer = transport, self.request.protocol, writer
        self._chunked = writer.chunked


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
