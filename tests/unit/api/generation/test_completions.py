"""/v1/completions without streaming: what reaches the engine and the response's shape."""

from __future__ import annotations

from dspark_loop.engine.outputs import RequestOutput
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.fake_engine import FakeEngine, reply_ids
from tests.unit.api.harness import MODEL, serving

BOS = 0


async def test_string_prompt_gets_bos_and_is_tokenised_without_special_tokens():
    """A string prompt must reach the engine as [BOS] + its plain tokenisation."""
    async with serving() as client:
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hello world"})
        assert r.status == 200
        g = client.engine.requests[0]
        expected = tiny_tokenizer().encode("hello world", add_special_tokens=False).ids
        assert g.prompt_token_ids == [BOS, *expected]
        assert g.params.max_tokens == 16  # OpenAI's default


async def test_token_id_prompts_are_taken_as_given_in_every_accepted_shape():
    """[ids], [[ids]] and ["text"] must be accepted; ids pass through untouched (no BOS)."""
    async with serving() as client:
        for prompt in ([5, 6, 7], [[5, 6, 7]]):
            r = await client.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
            assert r.status == 200
            assert client.engine.requests[-1].prompt_token_ids == [5, 6, 7]
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": ["hi"]})
        assert r.status == 200
        assert client.engine.requests[-1].prompt_token_ids[0] == BOS


async def test_response_is_an_openai_text_completion_with_exact_usage():
    """The body must carry id cmpl-*, object, created, model, one choice and exact usage."""
    async with serving() as client:
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4})
        body = await r.json()
        assert body["id"].startswith("cmpl-")
        assert body["object"] == "text_completion"
        assert isinstance(body["created"], int)
        assert body["model"] == MODEL
        ids = reply_ids()[:4]
        assert body["choices"] == [
            {
                "index": 0,
                "text": tiny_tokenizer().decode(ids),
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ]
        assert body["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "total_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 0},
        }


async def test_request_ids_are_unique():
    """Every request must get its own engine request id."""
    async with serving() as client:
        for _ in range(5):
            await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
        ids = [g.request_id for g in client.engine.requests]
        assert len(set(ids)) == 5


async def test_echo_and_return_token_ids_follow_vllm():
    """echo must prepend the prompt text; return_token_ids must add prompt_token_ids and
    token_ids to the choice."""
    async with serving() as client:
        r = await client.post(
            "/v1/completions", json={"prompt": "hello", "max_tokens": 2, "echo": True, "return_token_ids": True}
        )
        choice = (await r.json())["choices"][0]
        assert choice["text"] == "hello" + tiny_tokenizer().decode(reply_ids()[:2])
        assert choice["prompt_token_ids"] == client.engine.requests[0].prompt_token_ids
        assert choice["token_ids"] == reply_ids()[:2]


async def test_sampling_fields_reach_the_engine():
    """stop, stop_token_ids, ignore_eos, min_tokens, seed must reach SamplingParams as sent."""
    async with serving() as client:
        await client.post(
            "/v1/completions",
            json={
                "prompt": "x",
                "max_tokens": 8,
                "stop": ["END", "\n"],
                "stop_token_ids": [3],
                "ignore_eos": True,
                "min_tokens": 2,
                "seed": 11,
                "max_completion_tokens": 8,
            },
        )
        p = client.engine.requests[0].params
        assert (p.max_tokens, p.min_tokens, p.stop, p.stop_token_ids, p.ignore_eos, p.seed) == (
            8,
            2,
            ["END", "\n"],
            [3],
            True,
            11,
        )
        await client.post("/v1/completions", json={"prompt": "x", "stop": "END"})
        assert client.engine.requests[1].params.stop == ["END"]


async def test_generate_config_supplies_defaults_a_request_can_override():
    """--generate-config's max_new_tokens/stop/ignore_eos must apply when a request omits them."""
    from dspark_loop.config.server_config import GenerateDefaults

    defaults = GenerateDefaults(max_new_tokens=5, stop=("STOP",), ignore_eos=True, seed=3)
    async with serving(generate=defaults) as client:
        await client.post("/v1/completions", json={"prompt": "x"})
        await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stop": [], "ignore_eos": False})
        first, second = (g.params for g in client.engine.requests)
        assert (first.max_tokens, first.stop, first.ignore_eos, first.seed) == (5, ["STOP"], True, 3)
        assert (second.max_tokens, second.stop, second.ignore_eos) == (2, [], False)


def _failing(reason: str, error: str | None):
    def script(g):
        return [
            RequestOutput(g.request_id, [9], "a", num_output_tokens=1),
            RequestOutput(g.request_id, [], "", finished=True, finish_reason=reason, error=error),
        ]

    return script


async def test_engine_error_is_a_500_with_its_message_and_a_dead_engine_a_503():
    """finish_reason "error" must give 500 with the engine's message (503 when the engine
    is dead); an aborted request must give 503."""
    engine = FakeEngine(script=_failing("error", "rank 2 raised: boom"))
    async with serving(engine) as client:
        r = await client.post("/v1/completions", json={"prompt": "x"})
        assert r.status == 500
        assert "rank 2 raised: boom" in (await r.json())["error"]["message"]
        engine.script = _failing("abort", None)
        r = await client.post("/v1/completions", json={"prompt": "x"})
        assert r.status == 503

        def dies_mid_request(g):
            engine.die("rank 1 exited with 9")
            return _failing("error", "rank died")(g)

        engine.script = dies_mid_request
        r = await client.post("/v1/completions", json={"prompt": "x"})
        assert r.status == 503
        assert "rank 1 exited with 9" in (await r.json())["error"]["message"]


async def test_requests_are_refused_with_503_until_ready_and_after_death():
    """Completions must answer 503 (not reach the engine) while not ready or dead."""
    engine = FakeEngine(ready=False)
    async with serving(engine) as client:
        r = await client.post("/v1/completions", json={"prompt": "x"})
        assert r.status == 503 and (await r.json())["error"]["code"] == "engine_not_ready"
        engine.die("rank 0 hung")
        r = await client.post("/v1/completions", json={"prompt": "x"})
        assert r.status == 503 and "rank 0 hung" in (await r.json())["error"]["message"]
        assert engine.requests == []


async def test_long_prompts_are_tokenised_like_short_ones():
    """A prompt big enough to be tokenised off the event loop must give the same ids as
    direct tokenisation, and still be refused past the context with the numbers."""
    text = "the quick brown fox " * 5000  # 100 KB
    async with serving(FakeEngine(max_model_len=100000), max_model_len=100000) as client:
        r = await client.post("/v1/completions", json={"prompt": text, "max_tokens": 1})
        assert r.status == 200
        ids = tiny_tokenizer().encode(text, add_special_tokens=False).ids
        assert client.engine.requests[0].prompt_token_ids == [BOS, *ids]
    async with serving() as client:
        r = await client.post("/v1/completions", json={"prompt": text})
        assert r.status == 400
        message = (await r.json())["error"]["message"]
        assert f"{len(ids) + 1} tokens" in message and "64 tokens" in message
