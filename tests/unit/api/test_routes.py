"""/health, /v1/models, /tokenize, /detokenize, /metrics."""

from __future__ import annotations

from dspark_loop.api.app import add_metrics_routes
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.fake_engine import FakeEngine
from tests.unit.api.harness import MODEL, serving


async def test_health_is_503_until_ready_ok_while_ready_and_503_with_reason_after_death():
    """/health must follow the engine: not_ready -> ok -> dead with its reason."""
    engine = FakeEngine(ready=False)
    async with serving(engine) as client:
        r = await client.get("/health")
        assert (r.status, await r.json()) == (503, {"status": "not_ready"})
        assert r.headers["Retry-After"] == "1"  # as /v1/models and the generation routes say
        engine.ready = True
        r = await client.get("/health")
        assert (r.status, await r.json()) == (200, {"status": "ok"})
        engine.die("rank 2 stopped answering")
        r = await client.get("/health")
        assert r.status == 503
        assert await r.json() == {"status": "dead", "reason": "rank 2 stopped answering"}


async def test_models_is_503_with_retry_after_until_the_engine_is_ready_like_the_generation_routes():
    """A client that polls /v1/models until 200 and then sends must find the engine up: before
    the ranks are ready /v1/models answers what a completion would (503 engine_not_ready,
    Retry-After), and the listing once they are."""
    engine = FakeEngine(ready=False)
    async with serving(engine) as client:
        for r in (await client.get("/v1/models"), await client.post("/v1/completions", json={"prompt": "x"})):
            assert r.status == 503 and r.headers["Retry-After"] == "1"
            assert (await r.json())["error"]["code"] == "engine_not_ready"
        engine.ready = True
        r = await client.get("/v1/models")
        assert r.status == 200 and [c["id"] for c in (await r.json())["data"]] == [MODEL]


async def test_models_lists_the_served_name_and_context():
    """/v1/models must list exactly the served model with its max_model_len."""
    async with serving(served_model_name="dsv4-flash-w8a8") as client:
        body = await (await client.get("/v1/models")).json()
        assert body["object"] == "list"
        [card] = body["data"]
        assert (card["id"], card["object"], card["max_model_len"]) == ("dsv4-flash-w8a8", "model", 64)
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert r.status == 404  # the directory name no longer answers
        r = await client.post("/v1/completions", json={"model": "dsv4-flash-w8a8", "prompt": "x"})
        assert r.status == 200


async def test_a_model_is_retrieved_by_its_id_and_another_id_is_a_404():
    """GET /v1/models/{id} (the openai client's models.retrieve) must answer the listing's
    card for the served id, ids with a "/" included, and 404 model_not_found for another."""
    for served in ("dsv4-flash", "deepseek-ai/DeepSeek-V4-Flash"):
        async with serving(served_model_name=served) as client:
            listed = (await (await client.get("/v1/models")).json())["data"][0]
            r = await client.get(f"/v1/models/{served}")
            assert r.status == 200 and await r.json() == listed
            r = await client.get("/v1/models/other")
            err = (await r.json())["error"]
            assert r.status == 404 and err["code"] == "model_not_found" and "other" in err["message"]


async def test_tokenize_matches_what_completions_send_and_detokenize_round_trips():
    """/tokenize with special tokens must give the completion's prompt ids (BOS first);
    /detokenize of those ids must give the BOS text plus the original text."""
    async with serving() as client:
        text = "the quick brown fox"
        tok = await (await client.post("/tokenize", json={"prompt": text})).json()
        await client.post("/v1/completions", json={"prompt": text, "max_tokens": 1})
        assert tok["tokens"] == client.engine.requests[0].prompt_token_ids
        assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 64
        plain = await (await client.post("/tokenize", json={"text": text, "add_special_tokens": False})).json()
        assert plain["tokens"] == tok["tokens"][1:]
        back = await (await client.post("/detokenize", json={"tokens": plain["tokens"]})).json()
        assert back == {"prompt": text}
        with_bos = await (await client.post("/detokenize", json={"tokens": tok["tokens"]})).json()
        assert with_bos["prompt"] == tiny_tokenizer().id_to_token(0) + text
        long = "def f(x):\n    return x  # héllo\n" * 4000  # ~130 KB: tokenised off the event loop
        r = await client.post("/tokenize", json={"text": long, "add_special_tokens": False})
        assert (await r.json())["tokens"] == tiny_tokenizer().encode(long, add_special_tokens=False).ids


async def test_tokenize_routes_reject_bad_bodies():
    """Missing prompt, unknown model, non-int or out-of-vocab tokens must be 400/404."""
    async with serving() as client:
        cases = [
            ("/tokenize", {}, 400, "prompt"),
            ("/tokenize", {"prompt": "a", "model": "x"}, 404, "model"),
            ("/tokenize", {"prompt": "a", "text": "b"}, 400, "prompt"),
            ("/detokenize", {"tokens": ["a"]}, 400, "tokens"),
            ("/detokenize", {"tokens": [99999]}, 400, "tokens"),
            ("/detokenize", {}, 400, "tokens"),
        ]
        for path, body, status, param in cases:
            r = await client.post(path, json=body)
            assert r.status == status, (path, body)
            assert (await r.json())["error"]["param"] == param, (path, body)


class StubMetrics:
    def render_prometheus(self) -> str:
        return "vllm:num_requests_running 0\n"

    def snapshot(self) -> dict:
        return {"num_requests_running": 0}


async def test_metrics_routes_serve_the_renderers():
    """/metrics must serve render_prometheus() as text and /metrics/json the snapshot."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    app = web.Application()
    add_metrics_routes(app, StubMetrics())
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/metrics")
        assert r.headers["Content-Type"].startswith("text/plain")
        assert await r.text() == "vllm:num_requests_running 0\n"
        assert await (await client.get("/metrics/json")).json() == {"num_requests_running": 0}


async def test_an_unexpected_exception_is_a_json_500_and_the_server_keeps_serving(caplog):
    """A bug inside a route must answer 500 in the OpenAI error shape, not a traceback page:
    a request id the log's traceback carries too, and none of the exception's text."""
    engine = FakeEngine()
    async with serving(engine) as client:

        def broken(g):
            raise RuntimeError("scheduler bug at /secret/path")

        engine.script = broken
        r = await client.post("/v1/completions", json={"prompt": "x"})
        assert r.status == 500
        error = (await r.json())["error"]
        assert error["code"] == "internal_error" and error["type"] == "server_error"
        assert "secret" not in error["message"] and "RuntimeError" not in error["message"]
        request_id = r.headers["X-Request-Id"]
        assert request_id in error["message"]
        logged = [rec for rec in caplog.records if request_id in rec.getMessage()]
        assert logged and "scheduler bug at /secret/path" in str(logged[0].exc_info[1])
        engine.script = FakeEngine().script
        assert (await client.post("/v1/completions", json={"prompt": "x"})).status == 200
