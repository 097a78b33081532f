"""serve() (real sockets, signals) and run_offline (--prompt mode)."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import aiohttp

from dspark_loop.api.app import create_app
from dspark_loop.api.offline import run_offline
from dspark_loop.api.server import serve
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.fake_engine import FakeEngine, reply_ids, tiny_model_config
from tests.unit.api.harness import make_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_serve_answers_until_stopped_then_releases_the_port():
    """serve() must answer HTTP while running and return (closing the socket) when stopped."""
    port, stop, started = free_port(), asyncio.Event(), asyncio.Event()
    app = create_app(FakeEngine(), tiny_tokenizer(), make_config(), tiny_model_config())
    task = asyncio.create_task(serve(app, "127.0.0.1", port, stop=stop, started=started))
    await asyncio.wait_for(started.wait(), 5)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{port}/health") as r:
            assert r.status == 200
    stop.set()
    await asyncio.wait_for(task, 10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free again


SERVE_SCRIPT = """
import asyncio, sys
from dspark_loop.api.app import create_app
from dspark_loop.api.server import serve
from tests.unit.api.fake_engine import FakeEngine, tiny_model_config
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.harness import make_config
app = create_app(FakeEngine(), tiny_tokenizer(), make_config(), tiny_model_config())
asyncio.run(serve(app, "127.0.0.1", int(sys.argv[1])))
print("clean exit", flush=True)
"""


def test_sigterm_shuts_the_server_down_cleanly():
    """SIGTERM must end serve() normally (the code after it runs, exit status 0)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_SCRIPT, str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "clean exit" in out


async def test_run_offline_prints_each_completion_in_order():
    """run_offline must generate every prompt (BOS + text, capped max_tokens) and print and
    return the completions in the order given."""
    engine, out = FakeEngine(max_model_len=64), io.StringIO()
    texts = await run_offline(engine, tiny_tokenizer(), ["hello", "the fox"], 3, out=out)
    expected = tiny_tokenizer().decode(reply_ids()[:3])
    assert texts == [expected, expected]
    assert [g.prompt_token_ids[0] for g in engine.requests] == [0, 0]
    assert out.getvalue().index("'hello'") < out.getvalue().index("'the fox'")
    assert out.getvalue().count(expected) == 2
