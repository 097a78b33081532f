"""SIGTERM drains (open streams finish, new requests 503, exit 0, no process left);
SIGINT twice stops at once (open streams end with an error event, exit 0)."""

from __future__ import annotations

import asyncio
import signal
import time

from dspark_testing.prompts import token_prompt
from dspark_testing.server_process import ServerProcess, wait_gone
from dspark_testing.stream_client import open_stream

MAX_TOKENS = 160


async def read_all(stream) -> list:
    return [event async for event in stream.events()]


async def wait_health(server: ServerProcess, status: int, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        got, body = await asyncio.to_thread(server.get, "/health")
        if got == status or time.monotonic() > deadline:
            return body
        await asyncio.sleep(0.05)


def token_ids(events: list) -> list[int]:
    return [t for e in events if isinstance(e, dict) for c in e.get("choices", []) for t in c.get("token_ids", [])]


async def test_sigterm_lets_open_streams_finish_and_refuses_new_requests(tiny_ckpt, solo1, http):
    """After SIGTERM, /health must say 503 draining, a new request must get 503, the two
    open streams must still end with all their tokens (equal to each prompt served alone,
    on the 1-rank server: greedy tokens are the same on every topology) and [DONE], and the
    server must exit 0 leaving no rank behind."""
    prompts = [token_prompt(12, seed=41), token_prompt(30, seed=42)]
    solo = [await asyncio.to_thread(solo1, p, MAX_TOKENS) for p in prompts]
    server = await asyncio.to_thread(
        ServerProcess, ["--model", tiny_ckpt, "--tp", "2", "--ep", "2", "--shutdown-timeout", "120"]
    )
    try:
        ranks = server.rank_pids()
        streams = [
            await open_stream(
                http, server.url, {"prompt": p, "max_tokens": MAX_TOKENS, "ignore_eos": True, "return_token_ids": True}
            )
            for p in prompts
        ]
        readers = [asyncio.create_task(read_all(s)) for s in streams]
        server.proc.send_signal(signal.SIGTERM)
        assert '"draining"' in await wait_health(server, 503)
        assert not all(r.done() for r in readers)  # the drain really had streams to wait for
        status, out = await asyncio.to_thread(server.post, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert status == 503 and out["error"]["code"] == "server_shutting_down"
        results = await asyncio.wait_for(asyncio.gather(*readers), timeout=120)
        for events, want in zip(results, solo):
            assert events[-1] == "[DONE]" and not any("error" in e for e in events if isinstance(e, dict))
            assert token_ids(events) == want
        code = await asyncio.to_thread(server.proc.wait, 60)
        assert code == 0, server.log()[-3000:]
        assert await asyncio.to_thread(wait_gone, ranks, 10) == []
    finally:
        server.stop(signal.SIGKILL)


async def test_a_second_sigint_ends_open_streams_at_once_and_exits_cleanly(tiny_ckpt, http):
    """SIGINT starts a drain; a second SIGINT must end the open stream with an error event
    then [DONE], exit 0, and leave no rank behind."""
    server = await asyncio.to_thread(
        ServerProcess, ["--model", tiny_ckpt, "--tp", "2", "--ep", "2", "--shutdown-timeout", "600"]
    )
    try:
        ranks = server.rank_pids()
        stream = await open_stream(http, server.url, {"prompt": [5, 6, 7], "max_tokens": 900, "ignore_eos": True})
        reader = asyncio.create_task(read_all(stream))
        server.proc.send_signal(signal.SIGINT)
        assert '"draining"' in await wait_health(server, 503)
        server.proc.send_signal(signal.SIGINT)
        events = await asyncio.wait_for(reader, timeout=30)
        assert events[-1] == "[DONE]"
        assert [e for e in events if isinstance(e, dict) and "error" in e], events[-3:]
        code = await asyncio.to_thread(server.proc.wait, 60)
        assert code == 0, server.log()[-3000:]
        assert await asyncio.to_thread(wait_gone, ranks, 10) == []
    finally:
        server.stop(signal.SIGKILL)


def test_sigterm_while_the_ranks_load_cancels_the_start_up(tiny_ckpt):
    """SIGTERM as soon as the ranks are spawned must end the start-up (no "ready" line),
    exit 0 and leave no rank behind."""
    import os
    import subprocess
    import sys

    from dspark_testing.server_process import REPO, children_of, free_port

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dspark_loop",
            "--model",
            tiny_ckpt,
            "--tp",
            "2",
            "--ep",
            "2",
            "--port",
            str(free_port()),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
    )
    try:
        deadline = time.monotonic() + 60
        while len(ranks := children_of(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(ranks) == 2
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out.decode()[-3000:]
        assert b"ready in" not in out and b"stopped" in out
        assert wait_gone(ranks, 10) == []
    finally:
        proc.kill()
