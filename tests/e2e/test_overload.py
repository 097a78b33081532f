"""A flood beyond --max-queued-requests: immediate 503s with Retry-After while the admitted
requests complete with their correct greedy tokens."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from dspark_testing.prompts import token_prompt
from dspark_testing.server_process import ServerProcess, pools_full
from dspark_testing.stream_client import StreamResult

NUM_FLOOD = 16
MAX_TOKENS = 24


@pytest.fixture
def small_server(tiny_ckpt):
    server = ServerProcess(["--model", tiny_ckpt, "--max-num-seqs", "2", "--max-queued-requests", "3"])
    yield server
    assert server.stop() == 0


async def send(http, url: str, body: dict):
    """(status, headers, StreamResult or error body, the time the answer was complete)."""
    async with http.post(url + "/v1/completions", json={**body, "stream": True}) as resp:
        if resp.status != 200:
            return resp.status, dict(resp.headers), await resp.json(), time.monotonic()
        result = StreamResult()
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                payload = line[6:]
                result.events.append(payload if payload == "[DONE]" else json.loads(payload))
        return 200, dict(resp.headers), result, time.monotonic()


async def test_a_flood_gets_immediate_503s_while_admitted_requests_finish_correctly(small_server, http):
    """16 streams at once against 2 running slots and a queue of 3 must split into 200s and
    503s; every 503 must carry Retry-After and server_overloaded and arrive before the
    last admitted stream ends; every admitted stream must equal its prompt served alone."""
    prompts = [token_prompt(10 + i, seed=300 + i) for i in range(NUM_FLOOD)]
    bodies = [{"prompt": p, "max_tokens": MAX_TOKENS, "ignore_eos": True, "return_token_ids": True} for p in prompts]
    answers = await asyncio.gather(*(send(http, small_server.url, b) for b in bodies))
    admitted = [(i, a) for i, a in enumerate(answers) if a[0] == 200]
    refused = [a for a in answers if a[0] != 200]
    assert len(admitted) >= 3 and refused, [a[0] for a in answers]
    for status, headers, body, _ in refused:
        assert status == 503 and int(headers["Retry-After"]) >= 1
        assert body["error"]["code"] == "server_overloaded"
    last_admitted_done = max(a[3] for _, a in admitted)
    assert all(a[3] < last_admitted_done for a in refused)
    for i, (_, _, result, _) in admitted:
        solo = await asyncio.to_thread(small_server.complete, prompts[i], MAX_TOKENS)
        assert result.errors == [] and result.done
        assert result.token_ids == solo["choices"][0]["token_ids"], i
    assert pools_full(await asyncio.to_thread(small_server.wait_idle))
