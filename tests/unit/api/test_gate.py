"""The admission gate: a full queue is a 503 with Retry-After at once, a request that can
never fit is a 400, a draining server takes nothing new; a flood cannot slip past."""

from __future__ import annotations

import asyncio

from dspark_loop.api.app import GATE_KEY
from dspark_loop.engine.outputs import RequestOutput
from tests.unit.api.fake_engine import FakeEngine
from tests.unit.api.harness import MODEL, serving

BODY = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}


class QueueingEngine(FakeEngine):
    """Queues each request synchronously on its generator's first step (as EngineLoop
    does) and runs none until `release` is set; then each gets one token."""

    def __init__(self):
        super().__init__()
        self.release = asyncio.Event()

    async def generate(self, g):
        self.requests.append(g)
        self.num_waiting += 1
        try:
            await self.release.wait()
        finally:
            self.num_waiting -= 1
        yield RequestOutput(
            g.request_id,
            [65],
            "A",
            finished=True,
            finish_reason="length",
            num_prompt_tokens=len(g.prompt_token_ids),
            num_output_tokens=1,
        )


async def test_a_full_queue_answers_503_with_retry_after_and_an_openai_body():
    """With N requests waiting, a new one must get 503, a Retry-After header and an
    OpenAI error body (code server_overloaded), and never reach the engine."""
    engine = FakeEngine()
    engine.num_waiting = 4
    async with serving(engine, max_queued_requests=4) as client:
        for body in (BODY, {**BODY, "stream": True}):
            r = await client.post("/v1/completions", json=body)
            assert r.status == 503
            assert int(r.headers["Retry-After"]) >= 1
            err = (await r.json())["error"]
            assert (err["type"], err["code"]) == ("server_error", "server_overloaded")
        r = await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status == 503 and (await r.json())["error"]["code"] == "server_overloaded"
        assert engine.requests == []
        engine.num_waiting = 3
        assert (await client.post("/v1/completions", json=BODY)).status == 200


async def test_a_flood_admits_exactly_the_queue_limit_and_refuses_the_rest_at_once():
    """20 requests sent together against a limit of 3, none of which can start yet, must
    give exactly 3 queued requests and 17 immediate 503s; the 3 then complete."""
    engine = QueueingEngine()
    async with serving(engine, max_queued_requests=3) as client:
        tasks = [asyncio.create_task(client.post("/v1/completions", json=BODY)) for _ in range(20)]
        while sum(t.done() for t in tasks) < 17:
            await asyncio.sleep(0.01)
        refused = [t.result() for t in tasks if t.done()]
        assert all(r.status == 503 for r in refused)
        assert len(engine.requests) == 3 and engine.num_waiting == 3
        engine.release.set()
        done = await asyncio.gather(*tasks)
        assert sorted(r.status for r in done) == [200] * 3 + [503] * 17


async def test_a_request_that_can_never_fit_the_cache_is_a_400_naming_max_tokens():
    """When the engine says prompt + max_tokens exceed a partition's pages, the answer
    must be 400 request_too_large with param max_tokens, not a wait or a 500."""
    engine = FakeEngine()
    engine.too_large = "This request can never fit the KV cache: ..."
    async with serving(engine) as client:
        r = await client.post("/v1/completions", json=BODY)
        assert r.status == 400
        err = (await r.json())["error"]
        assert (err["code"], err["param"]) == ("request_too_large", "max_tokens")
        assert engine.requests == []


async def test_draining_refuses_new_requests_and_health_says_draining():
    """While draining, generation routes must answer 503 server_shutting_down and /health
    503 {"status": "draining"}; tokenize still works (it holds no engine resources)."""
    async with serving() as client:
        client.server.app[GATE_KEY].draining = True
        r = await client.post("/v1/completions", json=BODY)
        assert r.status == 503 and (await r.json())["error"]["code"] == "server_shutting_down"
        r = await client.get("/health")
        assert r.status == 503 and await r.json() == {"status": "draining"}
        assert (await client.post("/tokenize", json={"prompt": "hi"})).status == 200


async def test_the_gate_counts_active_requests_until_their_response_is_written():
    """num_active must be 1 while a request streams and 0 once it finished or its client
    left, and wait_idle must then return True."""
    engine = FakeEngine(delay_s=0.01)
    async with serving(engine) as client:
        gate = client.server.app[GATE_KEY]
        r = await client.post("/v1/completions", json={**BODY, "max_tokens": 50, "stream": True})
        await r.content.readline()
        assert gate.num_active == 1
        assert not await gate.wait_idle(0.01)
        await r.read()
        assert await gate.wait_idle(5) and gate.num_active == 0


async def test_more_choices_than_the_queue_holds_is_a_400_and_a_full_queue_refuses_them_all():
    """A batch of prompts or n > 1 queues every choice at once: more choices than
    --max-queued-requests can never be admitted (400 naming n or prompt, not a 503 that a
    retry cannot cure); more than the queue has room for now is one 503 for the whole
    answer, with none of its choices queued."""
    engine = FakeEngine()
    async with serving(engine, max_queued_requests=2) as client:
        for body, param in (({**BODY, "n": 6}, "n"), ({**BODY, "prompt": [[1], [2], [3]]}, "prompt")):
            r = await client.post("/v1/completions", json=body)
            err = (await r.json())["error"]
            assert r.status == 400 and (err["param"], err["code"]) == (param, "request_too_large"), err
        r = await client.post(
            "/v1/chat/completions", json={"model": MODEL, "n": 3, "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status == 400 and (await r.json())["error"]["param"] == "n"
        engine.num_waiting = 1
        r = await client.post("/v1/completions", json={**BODY, "n": 2})
        assert r.status == 503 and (await r.json())["error"]["code"] == "server_overloaded"
        assert engine.requests == []
        engine.num_waiting = 0
        r = await client.post("/v1/completions", json={**BODY, "n": 2})
        assert r.status == 200 and len((await r.json())["choices"]) == 2


async def test_an_answer_of_several_choices_logs_its_end_once(caplog):
    """A request of several choices must log how it ended (as a one-choice request does):
    answered, with its choices and tokens."""
    caplog.set_level("INFO", logger="dspark_loop.api.generation.choices")
    async with serving(FakeEngine()) as client:
        r = await client.post("/v1/completions", json={**BODY, "n": 3})
        assert r.status == 200
    ends = [rec.getMessage() for rec in caplog.records if " finished: " in rec.getMessage()]
    assert len(ends) == 1 and "finished: answered, 3 choices" in ends[0]
