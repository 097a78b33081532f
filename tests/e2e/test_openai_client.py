"""The official openai client, unmodified, against the real 4-rank server."""

from __future__ import annotations

import openai

from dspark_testing.prompts import TEXTS


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_completion_equals_the_raw_http_answer(server4, solo4):
    """client.completions.create must parse our answer and carry the same text and usage as
    a raw HTTP request for the same prompt."""
    c = client(server4)
    model = c.models.list().data[0].id
    raw = server4.complete(TEXTS[1], 6)
    out = c.completions.create(model=model, prompt=TEXTS[1], max_tokens=6, extra_body={"ignore_eos": True})
    assert out.choices[0].text == raw["choices"][0]["text"]
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 6
    assert out.usage.prompt_tokens == raw["usage"]["prompt_tokens"]


async def test_openai_async_client_streams_with_include_usage(server4):
    """AsyncOpenAI streaming with stream_options.include_usage must yield text chunks whose
    concatenation is the non-stream text, then one usage-only chunk with the true counts."""
    c = openai.AsyncOpenAI(base_url=server4.url + "/v1", api_key="unused", max_retries=0)
    whole = server4.complete(TEXTS[0], 6)
    stream = await c.completions.create(
        model=whole["model"],
        prompt=TEXTS[0],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    await c.close()
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole["choices"][0]["text"]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == 6
    assert usage.usage.prompt_tokens == whole["usage"]["prompt_tokens"]
