"""Prefix caching on a multi-turn chat: the second turn reuses the first turn's pages and
answers exactly as a server without prefix caching does."""

from __future__ import annotations

import openai
import pytest

from dspark_testing.server_process import ServerProcess

# NOTE: 8-token pages make the tiny model's prefix-hit unit 128 tokens (the LCM of the
# families' page spans: c16 pages hold 8 rows of 16 tokens), so short turns already hit.
ONE_RANK = ["--dp", "1", "--tp", "1", "--ep", "1", "--block-size", "8"]
SYSTEM = (
    "You are a careful assistant for a travel desk. Answer in one short sentence, "
    "name the city you are talking about, and never invent numbers. "
) * 2


@pytest.fixture(scope="module")
def servers(tiny_ckpt):
    cached = ServerProcess(["--model", tiny_ckpt, *ONE_RANK], wait=False)
    plain = ServerProcess(["--model", tiny_ckpt, *ONE_RANK, "--no-enable-prefix-caching"], wait=False)
    cached.wait_ready()  # NOTE: both start at once
    plain.wait_ready()
    yield cached, plain
    assert cached.stop() == 0, cached.log()[-4000:]
    assert plain.stop() == 0, plain.log()[-4000:]


def turn(server, messages):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    return c.chat.completions.create(
        model=c.models.list().data[0].id,
        messages=messages,
        max_tokens=6,
        reasoning_effort="none",
        extra_body={"ignore_eos": True},
    )


def conversation(server) -> list:
    """Two turns; the second repeats the first turn (prompt and answer) as its history."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Where is it warmer today, Paris or Rome?"},
    ]
    first = turn(server, messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And tomorrow?"},
    ]
    return [first, turn(server, messages)]


def test_second_chat_turn_hits_the_prefix_cache_and_matches_an_uncached_server(servers):
    """The second turn must report cached prompt tokens (the first turn's full pages) and
    produce the same message and usage as a server with prefix caching off, which reports
    none."""
    cached, plain = servers
    with_cache, without = conversation(cached), conversation(plain)
    assert with_cache[0].usage.prompt_tokens_details.cached_tokens == 0
    hit = with_cache[1].usage.prompt_tokens_details.cached_tokens
    assert 0 < hit <= with_cache[0].usage.prompt_tokens
    assert without[1].usage.prompt_tokens_details.cached_tokens == 0
    for a, b in zip(with_cache, without):
        assert a.choices[0].message.content == b.choices[0].message.content
        assert a.usage.prompt_tokens == b.usage.prompt_tokens
        assert a.usage.completion_tokens == b.usage.completion_tokens == 6
