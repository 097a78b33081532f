"""POST /v1/chat/completions over a FakeEngine: prompts, answers, streams, errors."""

from __future__ import annotations

import json

import pytest

from dspark_loop.api.chat.render import CHAT_MARKERS
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.harness import serving, sse_events
from tests.unit.api.scripted import chat_engine
from tests.unit.api.vectors import RENDER

D = "｜DSML｜"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
HI = [{"role": "user", "content": "hi"}]
NO_THINKING = {"chat_template_kwargs": {"thinking": False}}


def invoke(city: str) -> str:
    return (
        f'<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">{city}</{D}parameter>\n</{D}invoke>'
    )


def block(*invokes: str) -> str:
    return f"\n\n<{D}tool_calls>\n" + "\n".join(invokes) + f"\n</{D}tool_calls>"


async def post(client, body: dict):
    r = await client.post("/v1/chat/completions", json=body)
    return r.status, (sse_events(await r.read()) if body.get("stream") and r.status == 200 else await r.json())


def request_body(vector: dict) -> dict:
    body = {"messages": vector["messages"]}
    if vector["thinking_mode"] == "chat":
        body["chat_template_kwargs"] = {"thinking": False}
    elif vector["reasoning_effort"]:
        body["reasoning_effort"] = vector["reasoning_effort"]
    return body


GENERATING = [v for v in RENDER if v["messages"][-1]["role"] in ("user", "tool")]


@pytest.mark.parametrize("vector", GENERATING, ids=[v["name"] for v in GENERATING])
async def test_engine_receives_the_release_encoders_prompt_tokens(vector):
    """The ids sent to the engine must be the vector's rendered prompt tokenised without
    added special tokens (BOS comes from the render itself)."""
    async with serving(chat_engine()) as client:
        status, out = await post(client, request_body(vector))
        assert status == 200, out
        g = client.engine.requests[0]
    want = tiny_tokenizer().encode(vector["prompt"], add_special_tokens=False).ids
    assert g.prompt_token_ids == want
    assert g.prompt_token_ids[0] == 0  # BOS, once
    assert out["usage"]["prompt_tokens"] == len(want)


async def test_a_developer_message_is_a_system_message():
    """OpenAI's `developer` role (what current clients send for instructions) must render as
    the system turn it names; an unknown role is a 400 that lists developer among the roles."""
    prompts = []
    for role in ("system", "developer"):
        async with serving(chat_engine()) as client:
            status, out = await post(client, {"messages": [{"role": role, "content": "Be brief."}, *HI]})
            assert status == 200, out
            prompts.append(client.engine.requests[0].prompt_token_ids)
    assert prompts[0] == prompts[1]
    async with serving(chat_engine()) as client:
        status, out = await post(client, {"messages": [{"role": "critic", "content": "x"}, *HI]})
    assert status == 400 and out["error"]["param"] == "messages[0].role" and "developer" in out["error"]["message"]


async def test_chat_asks_for_its_markers_as_text_and_the_context_left_by_default():
    """Without max_tokens a chat answer may run to the end of the context, and the engine
    must spell the parser's markers (</think>, ｜DSML｜) in the text, and no other special token."""
    async with serving(chat_engine()) as client:
        status, out = await post(client, {"messages": HI})
        g = client.engine.requests[0]
    assert status == 200
    assert g.params.max_tokens == 4096 - len(g.prompt_token_ids)
    assert g.params.skip_special_tokens and g.params.keep_special == CHAT_MARKERS
    assert g.request_id.startswith("chatcmpl-") and out["id"] == g.request_id


async def test_max_completion_tokens_and_stop_reach_the_engine():
    """max_completion_tokens, stop and ignore_eos must mean what they mean for completions."""
    async with serving(chat_engine()) as client:
        await post(client, {"messages": HI, "max_completion_tokens": 7, "stop": ["x"], "ignore_eos": True})
        p = client.engine.requests[0].params
    assert (p.max_tokens, p.stop, p.ignore_eos) == (7, ["x"], True)


async def test_skip_special_tokens_false_keeps_every_special_token_and_true_only_the_markers():
    """vLLM's skip_special_tokens: false spells every special token in the text, on both
    routes; left out it is true, and chat still spells its parser's markers."""
    async with serving(chat_engine()) as client:
        await post(client, {"messages": HI, "skip_special_tokens": False})
        await post(client, {"messages": HI})
        r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "skip_special_tokens": False})
        assert r.status == 200, await r.text()
        kept, default, completion = (g.params for g in client.engine.requests)
    assert not kept.skip_special_tokens and not completion.skip_special_tokens
    assert default.skip_special_tokens and default.keep_special == CHAT_MARKERS


async def test_openai_account_fields_are_accepted_and_change_nothing():
    """store, metadata and service_tier (what an OpenAI app may send) must not be a 400,
    and the engine must get the same request as without them."""
    async with serving(chat_engine()) as client:
        plain = await post(client, {"messages": HI, "seed": 1})
        extra = {"store": False, "metadata": {"app": "x"}, "service_tier": "auto"}
        status, _ = await post(client, {"messages": HI, "seed": 1, **extra})
        first, second = client.engine.requests
    assert plain[0] == status == 200
    assert first.params == second.params and first.prompt_token_ids == second.prompt_token_ids


async def test_thinking_answer_splits_reasoning_from_content():
    """Text before </think> must come back as reasoning_content and reasoning; the rest as
    content; usage must carry the engine's cached prompt tokens."""
    async with serving(chat_engine("Let me see.</think>Four.", cached=16)) as client:
        status, out = await post(client, {"messages": HI})
    msg = out["choices"][0]["message"]
    assert status == 200 and out["object"] == "chat.completion"
    assert msg == {
        "role": "assistant",
        "content": "Four.",
        "reasoning_content": "Let me see.",
        "reasoning": "Let me see.",
    }
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 16


async def test_chat_mode_keeps_a_stray_think_tag_as_content():
    """With thinking off the prompt ends in </think>: the whole answer is content."""
    async with serving(chat_engine("a</think>b")) as client:
        _, out = await post(client, {"messages": HI, **NO_THINKING})
    msg = out["choices"][0]["message"]
    assert msg["content"] == "a</think>b" and msg["reasoning_content"] is None


async def test_tool_block_becomes_tool_calls_with_finish_reason_tool_calls():
    """A complete DSML block must become OpenAI tool_calls (JSON object arguments), content
    before it stays content, and finish_reason must be tool_calls."""
    async with serving(chat_engine("Checking." + block(invoke("Paris"), invoke("Rome")))) as client:
        _, out = await post(client, {"messages": HI, "tools": [WEATHER], **NO_THINKING})
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Checking."
    calls = choice["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2


async def test_a_block_cut_by_length_finishes_length_with_its_call_as_written():
    """A tool block cut short must finish "length" (not tool_calls) and list its call as far
    as it was written, as a stream of it would have sent it."""
    text = block(invoke("Paris"))[:-30]
    async with serving(chat_engine(text, reason="length")) as client:
        _, out = await post(client, {"messages": HI, "tools": [WEATHER], **NO_THINKING})
    choice = out["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "length" and [c["function"]["name"] for c in calls] == ["get_weather"]
    assert '{"city": "Paris"}'.startswith(calls[0]["function"]["arguments"])


async def test_stream_opens_with_the_role_and_reassembles_to_the_whole_answer():
    """A stream must start with delta.role assistant, carry reasoning, content and tool call
    deltas that join to the non-stream message, end with finish_reason, usage, [DONE]."""
    text = "Hmm.</think>Checking." + block(invoke("Paris"), invoke("Rome"))
    async with serving(chat_engine(text)) as client:
        _, whole = await post(client, {"messages": HI, "tools": [WEATHER]})
        _, events = await post(
            client, {"messages": HI, "tools": [WEATHER], "stream": True, "stream_options": {"include_usage": True}}
        )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    assert reasoning == "".join(d.get("reasoning", "") for d in deltas) == "Hmm."
    assert "".join(d.get("content", "") for d in deltas) == "Checking."
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            call = calls.setdefault(tc["index"], {"arguments": ""})
            if "id" in tc:
                call.update(id=tc["id"], name=tc["function"]["name"])
            call["arguments"] += tc["function"].get("arguments", "")
    want = whole["choices"][0]["message"]["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (w["function"]["name"], w["function"]["arguments"]) for w in want
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


async def test_parallel_tool_calls_false_truncates_to_the_first_call():
    """parallel_tool_calls=false must keep only the first call, streamed or not."""
    text = block(invoke("Paris"), invoke("Rome"))
    body = {"messages": HI, "tools": [WEATHER], "parallel_tool_calls": False, **NO_THINKING}
    async with serving(chat_engine(text)) as client:
        _, whole = await post(client, body)
        _, events = await post(client, {**body, "stream": True})
    calls = whole["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}]
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    indexes = {tc["index"] for e in events[:-1] for c in e["choices"] for tc in c["delta"].get("tool_calls", [])}
    assert indexes == {0}


async def test_malformed_tool_block_is_a_500_and_aborts_the_request():
    """A malformed block must answer 500 malformed_tool_call and abort the generation."""
    bad = (
        f'\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n<{D}parameter name="city" '
        f'string="maybe">Paris</{D}parameter>\n</{D}invoke>\n</{D}tool_calls> and more'
    )
    async with serving(chat_engine(bad)) as client:
        status, out = await post(client, {"messages": HI, "tools": [WEATHER], **NO_THINKING})
        assert status == 500 and out["error"]["code"] == "malformed_tool_call"
        assert out["error"]["type"] == "server_error"
        assert client.engine.aborted == [client.engine.requests[0].request_id]
        status, events = await post(client, {"messages": HI, "tools": [WEATHER], "stream": True, **NO_THINKING})
    assert status == 200 and events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "malformed_tool_call"
    assert all("error" not in e for e in events[:-2])


async def test_engine_failure_mid_stream_is_an_error_event_then_done():
    """An engine error after the headers must end the stream with an error event and [DONE]."""
    async with serving(chat_engine("abc", reason="error")) as client:
        status, events = await post(client, {"messages": HI, "stream": True})
    assert status == 200 and events[-1] == "[DONE]" and "error" in events[-2]


async def test_tool_choice_none_leaves_the_tools_out_of_the_prompt():
    """tool_choice "none" must render no tools preamble (and build no constraint)."""
    async with serving(chat_engine()) as client:
        await post(client, {"messages": HI, "tools": [WEATHER], "tool_choice": "none"})
        await post(client, {"messages": HI})
        with_none, plain = client.engine.requests
    assert with_none.prompt_token_ids == plain.prompt_token_ids
    assert with_none.constraint is None


async def test_engine_not_ready_is_a_503():
    """Before the ranks are up a chat request must get 503, as a completion does."""
    engine = chat_engine()
    engine.ready = False
    async with serving(engine) as client:
        status, out = await post(client, {"messages": HI})
    assert status == 503 and out["error"]["code"] == "engine_not_ready"
