"""The serving benchmark's client reads a streamed completion however its bytes arrive."""

from __future__ import annotations

import asyncio
import json

from tools.bench.serve_client import Stream


class Transport:
    def __init__(self) -> None:
        self.sent, self.closed = b"", False

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True


def chunked(*payloads: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"


def read(response: bytes, piece: int) -> tuple[dict, Transport]:
    async def main():
        stream = Stream(b"POST ...", asyncio.get_running_loop().create_future())
        transport = Transport()
        stream.connection_made(transport)
        for i in range(0, len(response), piece):
            stream.data_received(response[i : i + piece])
        stream.connection_lost(None)
        return stream.record, transport

    return asyncio.run(main())


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_token_ids_are_the_same_whatever_the_pieces_the_response_arrives_in():
    """The client must de-chunk and split events across any read boundary: every choice's
    token ids in order, the usage chunk and [DONE] ignored, and the connection closed at the
    last chunk."""
    body = chunked(
        event({"choices": [{"text": "a", "token_ids": [1, 2]}]}),
        event({"choices": [{"text": "b", "token_ids": [3]}]}) + event({"choices": [{"token_ids": [4, 5, 6]}]}),
        event({"choices": [], "usage": {"completion_tokens": 6}}),
        b"data: [DONE]\n\n",
    )
    for piece in (1, 3, 7, 64, len(HEAD + body)):
        record, transport = read(HEAD + body, piece)
        assert record["token_ids"] == [1, 2, 3, 4, 5, 6] and record["error"] is None
        assert record["ttft_s"] is not None and record["num_chunks"] == 3 and transport.closed


def test_an_error_event_and_an_http_error_are_reported():
    """A stream's error event and a refused request (its status and body) must land in the
    record's error, not be dropped."""
    record, _ = read(HEAD + chunked(event({"error": {"message": "boom"}})), 5)
    assert "boom" in record["error"]
    refused = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nbad request"
    record, _ = read(refused, 4)
    assert record["error"] == "HTTP 400: bad request" and record["token_ids"] == []
