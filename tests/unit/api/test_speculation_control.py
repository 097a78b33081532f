"""`"speculation": {...}` (extra_body): a request's cap on drafts and its own figures."""

from __future__ import annotations

import pytest

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.outputs import RequestOutput
from tests.unit.api.fake_engine import FakeEngine, reply_deltas
from tests.unit.api.harness import MODEL, serving, sse_events

ROUTES = [
    ("/v1/completions", {"prompt": "hello"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]}),
]


def with_stats(g) -> list[RequestOutput]:
    """The default reply whose finishing delta carries (proposed, accepted, verify steps)."""
    outs = reply_deltas(g)
    outs[-1].speculation = (14, 9, 2)
    return outs


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_max_draft_tokens_reaches_the_engine_and_defaults_to_k(path, body):
    """The cap must reach the engine's SamplingParams as sent; absent, it is DSPARK_K."""
    async with serving() as client:
        for spec, want in (({"max_draft_tokens": 0}, 0), ({"max_draft_tokens": 3}, 3), (None, DSPARK_K)):
            extra = {} if spec is None else {"speculation": spec}
            r = await client.post(path, json={"model": MODEL, "max_tokens": 2, **body, **extra})
            assert r.status == 200, await r.text()
            assert client.engine.requests[-1].params.max_draft_tokens == want


@pytest.mark.parametrize(("path", "body"), ROUTES)
@pytest.mark.parametrize(
    ("spec", "param"),
    [
        ({"max_draft_tokens": 8}, "speculation.max_draft_tokens"),
        ({"max_draft_tokens": -1}, "speculation.max_draft_tokens"),
        ({"max_draft_tokens": "all"}, "speculation"),
        ({"drafts": 3}, "speculation.drafts"),
    ],
)
async def test_bad_speculation_values_are_a_400_naming_the_field(path, body, spec, param):
    """An out-of-range cap, a wrong type or an unknown key must be refused with a 400 whose
    param names the field, before the engine sees the request."""
    async with serving() as client:
        r = await client.post(path, json={"model": MODEL, **body, "speculation": spec})
        assert r.status == 400
        assert (await r.json())["error"]["param"] == param
        assert client.engine.requests == []


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_return_stats_answers_the_requests_own_figures(path, body):
    """With return_stats the JSON answer must carry "speculation" with the engine's
    per-request proposed / accepted / verify steps, accepted as drafts (the engine's
    accepted tokens less each verify's bonus: 9 - 2); without it, no such field."""
    async with serving(FakeEngine(script=with_stats)) as client:
        base = {"model": MODEL, "max_tokens": 3, **body}
        got = await (await client.post(path, json={**base, "speculation": {"return_stats": True}})).json()
        assert got["speculation"] == {"proposed": 14, "accepted": 7, "verify_steps": 2}
        plain = await (await client.post(path, json=base)).json()
        assert "speculation" not in plain


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_return_stats_in_a_stream_rides_the_final_usage_chunk(path, body):
    """Streamed, the figures must come once, in the last chunk before [DONE] (the usage
    chunk when usage is asked for), summed over every choice (n = 2)."""
    async with serving(FakeEngine(script=with_stats)) as client:
        req = {"model": MODEL, "max_tokens": 3, "n": 2, "stream": True, **body}
        req["speculation"] = {"return_stats": True}
        for opts in (None, {"include_usage": True}):
            extra = {"stream_options": opts} if opts else {}
            events = sse_events(await (await client.post(path, json={**req, **extra})).read())
            assert events[-1] == "[DONE]"
            last = events[-2]
            assert last["speculation"] == {"proposed": 28, "accepted": 14, "verify_steps": 4}
            assert ("usage" in last) == bool(opts)
            assert sum("speculation" in e for e in events[:-1]) == 1
