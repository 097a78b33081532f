"""SIGTERM / SIGINT on the server: exit 0, every rank gone, open streams answered."""
from __future__ import annotations

import asyncio
import signal

import pytest

from tests.e2e.client import open_stream
from tests.e2e.server import ServerProcess, wait_gone


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_signal_shuts_the_server_and_its_ranks_down_cleanly(tiny_ckpt, http, sig):
    """A signal while a stream is open must end the stream (an error event, then [DONE]), stop every rank
    and exit the server with code 0, leaving no process behind."""
    server = await asyncio.to_thread(ServerProcess, ["--model", tiny_ckpt, "--tp", "2", "--ep", "2"])
    try:
        ranks = server.rank_pids()
        assert len(ranks) == 2
        stream = await open_stream(http, server.url, {"prompt": [5, 6, 7], "max_tokens": 900,
                                                      "ignore_eos": True})
        events = []

        async def read():
            async for event in stream.events():
                events.append(event)
        reader = asyncio.create_task(read())
        await asyncio.sleep(0.5)
        code = await asyncio.to_thread(server.stop, sig)
        await asyncio.wait_for(reader, timeout=5)
        assert code == 0, server.log()[-3000:]
        assert events and events[-1] == "[DONE]"
        assert [e for e in events if isinstance(e, dict) and "error" in e], events[-3:]
        assert await asyncio.to_thread(wait_gone, ranks, 10) == []
    finally:
        server.stop(signal.SIGKILL)
