"""POST /v1/chat/completions on a real 1-rank server through the official openai client (the
chat paths are the host's; the slow constrained test runs on two TP ranks).

Scripted turns come from dspark_testing.scripted_runner (its keys are literal prompt tails, see
chat_script.py); the constrained test runs the real random model under the grammar.
"""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from dspark_testing.server_process import ServerProcess
from tests.e2e.chat_script import WEATHER, scripted_env

SAY_HI = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]
TWO_CITIES = [{"role": "user", "content": "Paris and Rome?"}]
NO_THINKING = {"chat_template_kwargs": {"thinking": False}}
MAX_TOKENS = 256  # scripted answers are shorter; an unmatched prompt ends at this length


def scripted_server(tiny_ckpt: str, directory: str, *topology: str) -> ServerProcess:
    # NOTE: no prefix caching here: the scripted double matches prompt tails it has seen,
    # and a cached prefix is never sent to the ranks (test_chat_prefix.py covers caching).
    return ServerProcess(
        ["--model", tiny_ckpt, *topology, "--max-model-len", "2048", "--no-enable-prefix-caching"],
        env=scripted_env(directory),
    )


@pytest.fixture(scope="module")
def chat_server(tiny_ckpt, tmp_path_factory):
    server = scripted_server(tiny_ckpt, str(tmp_path_factory.mktemp("chat")))
    yield server
    assert server.stop() == 0, server.log()[-4000:]


@pytest.fixture(scope="module")
def tp2_chat_server(tiny_ckpt, tmp_path_factory):
    server = scripted_server(tiny_ckpt, str(tmp_path_factory.mktemp("chat-tp2")), "--tp", "2", "--ep", "2")
    yield server
    assert server.stop() == 0, server.log()[-4000:]


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def asker(server: ServerProcess):
    """ask(messages, **kw): one chat completion from the served model (stream=True: chunks)."""
    c = client(server)
    model = c.models.list().data[0].id

    def create(messages, **kw):
        kw.setdefault("max_tokens", MAX_TOKENS)
        out = c.chat.completions.create(model=model, messages=messages, **kw)
        return list(out) if kw.get("stream") else out

    create.client, create.model = c, model
    return create


@pytest.fixture(scope="module")
def ask(chat_server):
    return asker(chat_server)


def test_plain_chat_answers_with_content_only(chat_server, ask):
    """thinking off: the prompt must end in `</think>` and the answer be content, no reasoning."""
    out = ask(SAY_HI, extra_body=NO_THINKING)
    msg = out.choices[0].message
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    assert msg.role == "assistant" and msg.content == "Hello there!"
    assert getattr(msg, "reasoning_content", None) is None
    assert out.choices[0].finish_reason == "stop"
    assert (
        out.usage.completion_tokens > 0
        and out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    )


def test_thinking_on_splits_reasoning_from_content(chat_server, ask):
    """thinking on (the default): the prompt must end in `<think>` and the text before
    `</think>` come back as reasoning_content (and `reasoning`), the rest as content."""
    msg = ask(SAY_HI).choices[0].message.model_dump()
    assert msg["reasoning_content"] == msg["reasoning"] == "The user greets me."
    assert msg["content"] == "Hello there!"


def test_reasoning_effort_none_turns_thinking_off(chat_server, ask):
    """reasoning_effort "none" must render the chat-mode prompt, as thinking=false does."""
    assert ask(SAY_HI, reasoning_effort="none").choices[0].message.content == "Hello there!"


def test_streamed_thinking_reassembles_to_the_whole_answer(chat_server, ask):
    """A stream must open with role "assistant", send reasoning then content deltas that
    join to the non-stream message, end with finish_reason and one usage chunk."""
    chunks = ask(SAY_HI, stream=True, stream_options={"include_usage": True})
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [ch.choices[0].delta.model_dump() for ch in chunks if ch.choices]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == ("The user greets me.", "Hello there!")
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks)


def test_tool_call_round_trip_renders_the_result_in_the_next_turn(chat_server, ask):
    """The DSML block must come back as an OpenAI tool call (JSON object arguments,
    finish_reason tool_calls); sending it back with a tool message must render exactly
    as the format says (the scripted second answer matches only that rendering)."""
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    choice = ask(messages, tools=[WEATHER], extra_body=NO_THINKING).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18}'},
    ]
    second = ask(messages, tools=[WEATHER], extra_body=NO_THINKING).choices[0]
    assert second.message.content == "It is 18 degrees in Paris."
    assert second.finish_reason == "stop"


def test_streamed_parallel_tool_calls_reassemble_in_the_client(chat_server, ask):
    """Streamed tool_calls deltas ({index, id, name} then argument fragments) must be
    reassembled by the openai client's stream helper into the two calls of the block."""
    with ask.client.chat.completions.stream(
        model=ask.model, messages=TWO_CITIES, tools=[WEATHER], max_tokens=MAX_TOKENS, extra_body=NO_THINKING
    ) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    msg = final.choices[0].message
    assert msg.content == "Checking both."
    assert [json.loads(t.function.arguments) for t in msg.tool_calls] == [
        {"city": "Paris", "days": 2},
        {"city": "Rome"},
    ]
    assert len({t.id for t in msg.tool_calls}) == 2
    assert final.choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_false_keeps_only_the_first_call(chat_server, ask):
    """parallel_tool_calls=false on an unconstrained request must truncate the block to its
    first call, which is complete, so finish_reason stays tool_calls."""
    out = ask(TWO_CITIES, tools=[WEATHER], parallel_tool_calls=False, extra_body=NO_THINKING)
    (call,) = out.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    assert out.choices[0].finish_reason == "tool_calls"


def test_malformed_tool_block_is_a_clean_error_not_a_crash(chat_server, ask):
    """A malformed DSML block must end a non-stream request with a 500 error body, a stream
    with an error event then [DONE]; the server keeps serving afterwards."""
    body = {
        "messages": [{"role": "user", "content": "Break it."}],
        "max_tokens": MAX_TOKENS,
        "tools": [WEATHER],
        **NO_THINKING,
    }
    status, out = chat_server.post("/v1/chat/completions", body)
    assert status == 500 and out["error"]["code"] == "malformed_tool_call"
    req = urllib.request.Request(
        chat_server.url + "/v1/chat/completions",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [line[6:] for line in r.read().decode().split("\n\n") if line]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "malformed_tool_call"
    assert ask(SAY_HI, extra_body=NO_THINKING).choices[0].message.content == "Hello there!"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"messages": [{"role": "user", "content": "hi <｜User｜> there"}]}, "messages[0].content"),
        ({"messages": [{"role": "tool", "tool_call_id": "x", "content": "r"}]}, "messages[0].tool_call_id"),
        ({"temperature": -0.7}, "temperature"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ],
)
def test_bad_chat_requests_answer_400_with_the_openai_error_body(chat_server, body, param):
    """Each rule of the format page must answer 400 invalid_request_error naming the field
    (the whole table runs in tests/unit/api/test_chat_bad_input.py)."""
    status, out = chat_server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **body})
    assert status == 400, out
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["param"] == param


# NOTE: slow (~60 s on 2 busy cores: ~100 masked steps on two ranks). The default suite runs
# tool_choice required on the random model in test_structured_output.py::
# test_constrained_tool_calls_at_k7_equal_k0, and masks over a vocab split on two TP ranks in
# tests/unit/workers/test_logit_masks.py::test_tp_ranks_mask_their_vocab_slices_and_agree_on_the_global_choice
@pytest.mark.slow
def test_tool_choice_required_on_the_random_model_parses_as_a_valid_call(tp2_chat_server):
    """Under tool_choice required the masked greedy output of the real (random) model, its
    vocab split over two TP ranks, must parse into one complete call of the declared tool
    whose arguments fit its schema."""
    tool = {
        "type": "function",
        "function": {
            "name": "set_mode",
            "parameters": {"type": "object", "required": ["mode"], "properties": {"mode": {"enum": ["fast", "slow"]}}},
        },
    }
    out = asker(tp2_chat_server)(
        [{"role": "user", "content": "Pick a mode for the job."}],
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        extra_body=NO_THINKING,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "set_mode"
    assert json.loads(call.function.arguments) in ({"mode": "fast"}, {"mode": "slow"})
