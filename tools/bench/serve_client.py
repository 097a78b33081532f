"""The serving benchmark's load: N concurrent streaming /v1/completions requests, sent at once
from this process (a separate one from the server, so the client's CPU is not the server's).

    python -m tools.bench.serve_client SPEC.json   -> one JSON object on stdout

SPEC: {"url": ..., "bodies": [request bodies], "timeout_s": ...}. Each stream records when
each chunk arrived and which token ids it carried; the answer holds, per stream, the token
ids, the time to its first token, the gaps between its chunks (a K=7 chunk carries several
tokens: the gap is what a reader sees) and any error, plus the wall time from the first send
to the last byte and this process's CPU seconds over that window.

NOTE: the client shares the machine with the server it measures, so it is as cheap as a
Python client gets: one asyncio Protocol per stream parses the HTTP/1.1 response (chunked
transfer) and the SSE events in its data_received callback, with no task woken per chunk;
a chunk's JSON is decoded by msgspec into the token ids alone. Events that arrived in one
read count as one arrival.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from urllib.parse import urlsplit

import msgspec

HEAD_END = b"\r\n\r\n"
CRLF = b"\r\n"
EVENT_END = b"\n\n"  # an SSE event ends with an empty line
DATA = b"data: "
DONE = b"[DONE]"


class Choice(msgspec.Struct):
    token_ids: list[int] | None = None


class Event(msgspec.Struct):
    """What the client reads of a chunk (msgspec skips every other field unparsed)."""

    choices: list[Choice] = []
    error: msgspec.Raw = msgspec.Raw()  # empty: no error


EVENT = msgspec.json.Decoder(Event)


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class Stream(asyncio.Protocol):
    """One request: sends it, then reads the response as it arrives into `record`
    (token_ids, ttft_s, gaps_s between arrivals with tokens, total_s, error)."""

    def __init__(self, request: bytes, done: asyncio.Future) -> None:
        self.request, self.done = request, done
        self.record: dict = {"token_ids": [], "ttft_s": None, "gaps_s": [], "total_s": 0.0, "error": None}
        self.record["num_chunks"] = 0  # events that carried tokens (the server's writes, merged or not)
        self.sent = self.last = 0.0
        self.head: bytes | None = None  # the status line and headers, once read
        self.status = 0
        self.chunked = False
        self.raw = b""  # received, not yet de-chunked (or the head, until it is complete)
        self.body = b""  # de-chunked, not yet a whole event

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.sent = time.perf_counter()
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        raw = self.raw + data
        if self.head is None:
            end = raw.find(HEAD_END)
            if end < 0:
                self.raw = raw
                return
            self.head, raw = raw[:end], raw[end + 4 :]
            self.status = int(self.head.split(b" ", 2)[1])
            self.chunked = b"transfer-encoding: chunked" in self.head.lower()
        if not self.chunked:
            self.body += raw
            self.raw = b""
        else:
            pieces = []
            while True:  # whole chunks only: "<hex size>\r\n<payload>\r\n"
                eol = raw.find(CRLF)
                if eol < 0:
                    break
                size = int(raw[:eol].split(b";", 1)[0], 16)
                if size == 0:  # the last chunk: the response is complete
                    self.transport.close()
                    break
                if len(raw) < eol + 2 + size + 2:
                    break
                pieces.append(raw[eol + 2 : eol + 2 + size])
                raw = raw[eol + 2 + size + 2 :]
            self.raw = raw
            self.body += b"".join(pieces)
        if self.status == 200:
            self.read_events()

    def read_events(self) -> None:
        *events, self.body = self.body.split(EVENT_END)
        rec = self.record
        got = False
        for event in events:
            if not event.startswith(DATA) or event[len(DATA) :] == DONE:
                continue
            try:
                parsed = EVENT.decode(event[len(DATA) :])
            except msgspec.DecodeError as e:
                rec["error"] = f"DecodeError: {e}"[:200]
                continue
            if parsed.error:
                rec["error"] = bytes(parsed.error)[:200].decode("utf-8", "replace")
                continue
            carried = False
            for c in parsed.choices:
                if c.token_ids:
                    rec["token_ids"] += c.token_ids
                    carried = True
            rec["num_chunks"] += carried
            got |= carried
        if got:
            now = time.perf_counter()
            if rec["ttft_s"] is None:
                rec["ttft_s"] = now - self.sent
            else:
                rec["gaps_s"].append(now - self.last)
            self.last = now

    def connection_lost(self, exc) -> None:
        rec = self.record
        if self.status != 200 and rec["error"] is None:
            rec["error"] = f"HTTP {self.status}: {self.body[:200].decode('utf-8', 'replace')}"
        elif exc is not None and rec["error"] is None:
            rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
        rec["total_s"] = time.perf_counter() - self.sent
        if not self.done.done():
            self.done.set_result(None)


def http_post(host: str, port: int, path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + payload


async def one_stream(url: str, body: dict) -> dict:
    """A stream's record: token_ids, ttft_s, gaps_s (between arrivals with tokens), error."""
    loop = asyncio.get_running_loop()
    where = urlsplit(url)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    done = loop.create_future()
    stream = Stream(http_post(host, port, "/v1/completions", {**body, "stream": True}), done)
    try:
        transport, _ = await loop.create_connection(lambda: stream, host, port)
    except OSError as e:
        stream.record["error"] = f"{type(e).__name__}: {e}"[:200]
        return stream.record
    try:
        await done
    finally:
        transport.close()
    return stream.record


async def run_load(url: str, bodies: list[dict], timeout_s: float = 3600.0) -> dict:
    """Every body streamed at once over one connection each; the streams' records in order."""
    c0, t0 = cpu_s(), time.perf_counter()
    streams = await asyncio.wait_for(asyncio.gather(*(one_stream(url, b) for b in bodies)), timeout_s)
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    return {"streams": streams, "wall_s": wall, "client_cpu_s": cpu}


def run_spec(path: str) -> int:
    """Run the load a SPEC file describes; its answer as JSON on stdout."""
    with open(path) as f:
        spec = json.load(f)
    try:
        import uvloop  # the server's loop too; a faster client disturbs the server less

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(run_load(spec["url"], spec["bodies"], spec.get("timeout_s", 3600.0)))
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(run_spec(sys.argv[1]))
