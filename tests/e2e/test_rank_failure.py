"""A rank killed mid-stream with recovery off (--max-rank-restarts 0): every open request
ends with an error, /health says 503, and no rank process is left behind.
(With recovery on, test_rank_recovery.py.)"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from dspark_testing.prompts import token_prompt
from dspark_testing.server_process import ServerProcess, wait_gone
from dspark_testing.stream_client import open_stream, read_while_flowing


@pytest.fixture
def doomed_server(tiny_ckpt):
    server = ServerProcess(["--model", tiny_ckpt, "--tp", "2", "--ep", "2", "--max-rank-restarts", "0"])
    yield server
    server.stop()


# NOTE: slow: the default suite has both halves in test_rank_recovery.py, open streams ending
# with an error event when a rank is killed (test_a_lost_rank_fails_only_the_running_requests_
# and_the_mesh_comes_back[SIGKILL]) and a server left dead by the restart budget: /health 503,
# requests 503 engine_dead, no rank left (test_a_crash_loop_stops_after_max_rank_restarts)
@pytest.mark.slow
async def test_killed_rank_ends_every_open_stream_with_an_error(doomed_server, http):
    """SIGKILL on one rank while 3 streams run must end each stream with an error event and
    then [DONE] within seconds, flip /health to 503 naming the dead rank, refuse new
    requests with 503, and leave no rank process alive."""
    server = doomed_server
    ranks = server.rank_pids()
    assert len(ranks) == 2
    streams = [
        await open_stream(
            http, server.url, {"prompt": token_prompt(20 + i, seed=i), "max_tokens": 900, "ignore_eos": True}
        )
        for i in range(3)
    ]
    readers = await read_while_flowing(streams)  # tokens are flowing on every stream
    assert not any(r.done() for r in readers)
    os.kill(ranks[1], signal.SIGKILL)
    killed_at = time.monotonic()
    results = await asyncio.wait_for(asyncio.gather(*readers), timeout=15)
    took = time.monotonic() - killed_at
    for events in results:
        assert events[-1] == "[DONE]"
        errors = [e for e in events if isinstance(e, dict) and "error" in e]
        assert len(errors) == 1 and "rank" in errors[0]["error"]["message"], events[-3:]
    assert took < 15
    status, body = await asyncio.to_thread(server.get, "/health")
    assert status == 503 and "dead" in body
    status, out = await asyncio.to_thread(server.post, "/v1/completions", {"prompt": "hi"})
    assert status == 503 and out["error"]["code"] == "engine_dead"
    assert await asyncio.to_thread(wait_gone, ranks, 10) == []
