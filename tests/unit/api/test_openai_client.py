"""The official openai client, unmodified, against the API on a real localhost port."""

from __future__ import annotations

import openai
import pytest

from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.fake_engine import reply_ids
from tests.unit.api.harness import MODEL, serving


def _client(test_client) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(test_client.make_url("/v1")), api_key="x", max_retries=0)


async def test_openai_client_completion_and_models():
    """client.completions.create must parse our body: text, finish_reason and usage."""
    async with serving() as tc:
        oc = _client(tc)
        resp = await oc.completions.create(model=MODEL, prompt="hello", max_tokens=4, temperature=0)
        assert resp.choices[0].text == tiny_tokenizer().decode(reply_ids()[:4])
        assert resp.choices[0].finish_reason == "length"
        assert resp.usage.completion_tokens == 4
        assert resp.usage.prompt_tokens == len(tc.engine.requests[0].prompt_token_ids)
        assert [m.id for m in (await oc.models.list()).data] == [MODEL]
        await oc.close()


async def test_openai_client_streams_with_include_usage():
    """Streaming through the client must give the same text, then one usage-only chunk."""
    async with serving() as tc:
        oc = _client(tc)
        stream = await oc.completions.create(
            model=MODEL, prompt="hello", max_tokens=5, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == tiny_tokenizer().decode(reply_ids()[:5])
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        await oc.close()


async def test_openai_client_raises_its_own_errors_for_our_error_bodies():
    """Our 400/404 bodies must surface as the client's BadRequestError/NotFoundError with
    our message."""
    async with serving() as tc:
        oc = _client(tc)
        with pytest.raises(openai.BadRequestError, match="temperature"):
            await oc.completions.create(model=MODEL, prompt="hi", temperature=-0.7)
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await oc.completions.create(model="other", prompt="hi")
        await oc.close()


async def test_openai_client_raises_on_an_error_event_mid_stream():
    """An engine failure after the headers must surface in the client as an APIError
    carrying the engine's message."""
    from dspark_loop.engine.outputs import RequestOutput
    from tests.unit.api.fake_engine import FakeEngine

    def script(g):
        return [
            RequestOutput(g.request_id, [9], "a", num_output_tokens=1),
            RequestOutput(g.request_id, [], "", finished=True, finish_reason="error", error="rank 1 failed the step"),
        ]

    async with serving(FakeEngine(script=script)) as tc:
        oc = _client(tc)
        stream = await oc.completions.create(model=MODEL, prompt="hi", max_tokens=4, stream=True)
        with pytest.raises(openai.APIError, match="rank 1 failed the step"):
            async for _ in stream:
                pass
        await oc.close()
