"""render_messages and chat_options: the release encoder's prompts, character for character."""

from __future__ import annotations

import json

import pytest

from dspark_loop.api.chat.render import ASSISTANT, BOS, EOS, USER, chat_options, render_messages
from tests.unit.api.vectors import RENDER

WEATHER = RENDER[6]["messages"][0]["tools"]


@pytest.mark.parametrize("vector", RENDER, ids=[v["name"] for v in RENDER])
def test_every_render_vector_is_reproduced_exactly(vector):
    """The prompt must equal the release encoder's output character for character."""
    prompt = render_messages(
        vector["messages"],
        tools=None,
        thinking=vector["thinking_mode"] == "thinking",
        reasoning_effort=vector["reasoning_effort"],
    )
    assert prompt == vector["prompt"]


def test_request_tools_attach_to_the_first_system_message_like_message_tools():
    """Tools given at request level must render exactly as tools carried by the system message."""
    vector = RENDER[6]
    messages = [{k: v for k, v in m.items() if k != "tools"} for m in vector["messages"]]
    assert render_messages(messages, tools=WEATHER, thinking=True, reasoning_effort="low") == vector["prompt"]


def test_tools_without_a_system_message_get_a_synthesised_one():
    """With no system message the tools preamble must still come right after BOS."""
    prompt = render_messages([{"role": "user", "content": "hi"}], tools=WEATHER, thinking=False)
    assert prompt.startswith(BOS + "\n\n## Tools\n")
    assert prompt.endswith(f"invoke tool calls.\n{USER}hi{ASSISTANT}</think>")
    assert json.dumps(WEATHER[0]["function"], ensure_ascii=False) in prompt


def test_reasoning_field_is_accepted_under_either_name_for_a_trailing_assistant_turn():
    """A trailing assistant message must keep its reasoning, read from reasoning_content or
    reasoning."""
    for key in ("reasoning_content", "reasoning"):
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", key: "why"}]
        assert render_messages(messages, thinking=True) == (f"{BOS}{USER}q{ASSISTANT}<think>why</think>a{EOS}")


def test_text_parts_are_joined_and_arguments_may_be_an_object():
    """List content must be joined; function.arguments as an object must render like the
    same JSON string."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"s": "x", "n": [1, 2]}}}
    as_str = {**call, "function": {**call["function"], "arguments": json.dumps({"s": "x", "n": [1, 2]})}}
    base = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    one = render_messages(base + [{"role": "assistant", "content": None, "tool_calls": [call]}], thinking=False)
    two = render_messages(base + [{"role": "assistant", "content": "", "tool_calls": [as_str]}], thinking=False)
    assert one == two
    assert f"{USER}ab{ASSISTANT}" in one
    assert '<｜DSML｜parameter name="n" string="false">[1, 2]</｜DSML｜parameter>' in one


def test_tool_results_then_user_text_share_one_user_turn():
    """Tool results followed by a user message must render as one user turn, results first."""
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "R"},
        {"role": "user", "content": "thanks"},
    ]
    prompt = render_messages(messages, thinking=False)
    assert prompt.endswith(f"{EOS}{USER}<tool_result>R</tool_result>\n\nthanks{ASSISTANT}</think>")
    assert prompt.count(USER) == 2


@pytest.mark.parametrize(
    "body,expected",
    [
        ({}, (True, None)),
        ({"reasoning_effort": "none"}, (False, None)),
        ({"reasoning_effort": "minimal"}, (True, "low")),
        ({"reasoning_effort": "low"}, (True, "low")),
        ({"reasoning_effort": "medium"}, (True, "high")),
        ({"reasoning_effort": "high"}, (True, "high")),
        ({"reasoning_effort": "xhigh"}, (True, "high")),
        ({"reasoning_effort": "max"}, (True, "max")),
        ({"chat_template_kwargs": {"thinking": False}}, (False, None)),
        ({"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "max"}, (False, None)),
        ({"chat_template_kwargs": {"thinking": True}}, (True, None)),
        ({"thinking": {"type": "disabled"}}, (False, None)),
    ],
)
def test_chat_options_map_api_fields_like_deepseek_and_vllm(body, expected):
    """Thinking must be on unless turned off; efforts must map onto the encoder's table."""
    assert chat_options(body) == expected


@pytest.mark.parametrize(
    "body,expected",
    [
        ({}, (False, None)),
        ({"chat_template_kwargs": {"enable_thinking": True}}, (True, None)),
        ({"chat_template_kwargs": {"thinking": True}, "reasoning_effort": "max"}, (True, "max")),
        ({"thinking": {"type": "enabled"}}, (True, None)),
        ({"chat_template_kwargs": {"thinking": True}, "reasoning_effort": "none"}, (False, None)),
    ],
)
def test_a_request_overrides_the_servers_default_chat_template_kwargs(body, expected):
    """A server default of thinking off (--default-chat-template-kwargs) must hold for a
    request that says nothing, and give way to one that turns thinking on by either key
    or DeepSeek's `thinking` field."""
    assert chat_options(body, {"thinking": False}) == expected


def test_an_unknown_effort_is_refused():
    """An effort outside the known names must not silently pick a paragraph."""
    with pytest.raises(ValueError):
        chat_options({"reasoning_effort": "extreme"})
