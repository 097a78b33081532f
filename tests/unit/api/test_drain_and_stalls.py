"""Drain (what SIGTERM / SIGINT mean) and streams whose client stopped reading."""

from __future__ import annotations

import asyncio
import json
import signal
import socket

from dspark_loop.api.drain import Drain
from dspark_loop.api.gate import AdmissionGate
from tests.unit.api.fake_engine import FakeEngine
from tests.unit.api.harness import MODEL, serving
from tests.unit.api.test_stream import endless_reply


async def open_request(gate: AdmissionGate, engine: FakeEngine):
    """An admitted request that stays active until the returned generator is closed."""
    from dspark_loop.engine.outputs import GenerateRequest, SamplingParams

    gen = gate.generate(GenerateRequest(f"r{len(engine.requests)}", [1, 2], SamplingParams(max_tokens=10**6)))
    await anext(gen)
    return gen


async def test_sigterm_drains_then_stops_once_the_last_request_is_done():
    """SIGTERM must stop admissions at once but set `stop` only after the active request
    has ended."""
    engine = FakeEngine(script=endless_reply)
    gate, stop = AdmissionGate(engine), asyncio.Event()
    drain = Drain(gate, timeout_s=60, stop=stop)
    gen = await open_request(gate, engine)
    drain.on_signal(signal.SIGTERM)
    assert gate.draining
    # NOTE: sleeps on purpose: no event stands for "stop was not set"; they give a wrong
    # drain the time to set it
    await asyncio.sleep(0.05)
    assert not stop.is_set()
    drain.on_signal(signal.SIGTERM)  # a repeated SIGTERM does not cut the drain short
    await asyncio.sleep(0.05)
    assert not stop.is_set()
    await gen.aclose()
    await asyncio.wait_for(stop.wait(), 5)


async def test_a_drain_that_times_out_stops_anyway():
    """A request still running at the deadline must not keep the server up."""
    engine = FakeEngine(script=endless_reply)
    gate, stop = AdmissionGate(engine), asyncio.Event()
    gen = await open_request(gate, engine)
    Drain(gate, timeout_s=0.05, stop=stop).on_signal(signal.SIGTERM)
    await asyncio.wait_for(stop.wait(), 5)
    assert gate.num_active == 1
    await gen.aclose()


async def test_a_second_sigint_stops_at_once():
    """Ctrl-C twice: the second SIGINT must set `stop` without waiting for the drain."""
    engine = FakeEngine(script=endless_reply)
    gate, stop = AdmissionGate(engine), asyncio.Event()
    drain = Drain(gate, timeout_s=60, stop=stop)
    gen = await open_request(gate, engine)
    drain.on_signal(signal.SIGINT)
    assert gate.draining and not stop.is_set()
    drain.on_signal(signal.SIGINT)
    assert stop.is_set()
    await gen.aclose()


async def test_a_stream_whose_client_stops_reading_is_aborted_after_the_write_timeout():
    """A client that sends a stream request and then never reads (a small receive buffer)
    must have its request aborted once a write stayed blocked for the write timeout: the
    engine's generator is closed before its (endless) reply ends."""
    engine = FakeEngine(script=endless_reply)
    async with serving(engine, stream_write_timeout_s=0.3) as client:
        body = json.dumps({"model": MODEL, "prompt": [1, 2], "max_tokens": 60, "stream": True}).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (client.host, client.port))
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        await loop.sock_sendall(sock, head + body)
        try:
            await asyncio.wait_for(engine.closed.wait(), 60)
            assert len(engine.aborted) == 1
        finally:
            sock.close()


async def test_a_slow_reader_within_the_timeout_gets_every_token():
    """A client that reads slowly but keeps reading must get its whole stream."""
    engine = FakeEngine(delay_s=0.001)
    async with serving(engine, stream_write_timeout_s=5) as client:
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": [1], "max_tokens": 40, "stream": True})
        raw = b""
        while chunk := await r.content.read(64):
            raw += chunk
            await asyncio.sleep(0.001)
        assert raw.endswith(b"data: [DONE]\n\n") and raw.count(b'"text"') == 40
        assert engine.aborted == []
