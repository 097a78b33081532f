"""serving(): the API app over a FakeEngine on aiohttp's test server (a real localhost port)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace

from aiohttp.test_utils import TestClient, TestServer

from dspark_loop.api.app import create_app
from dspark_loop.config.server_config import ServerConfig, fill_defaults
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.fake_engine import FakeEngine, tiny_model_config

MODEL = "tiny-test"


def make_config(**overrides) -> ServerConfig:
    return fill_defaults(replace(ServerConfig(model="/models/tiny-test", max_model_len=64), **overrides))


@contextlib.asynccontextmanager
async def serving(engine: FakeEngine | None = None, *, handler_cancellation: bool = True, **cfg):
    engine = engine or FakeEngine()
    app = create_app(engine, tiny_tokenizer(), make_config(**cfg), tiny_model_config())
    server = TestServer(app, host="127.0.0.1", handler_cancellation=handler_cancellation)
    async with TestClient(server) as client:
        client.engine = engine
        yield client


def sse_events(raw: bytes) -> list:
    """Parse an SSE body strictly: every event is exactly `data: <payload>\\n\\n`."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-40:]!r}"
    events = []
    for block in text[:-2].split("\n\n"):
        assert block.startswith("data: ") and "\n" not in block, f"bad SSE frame {block!r}"
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
