"""StreamingChatParser: any cut of the text must reassemble to the non-streaming message."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from dspark_loop.api.chat.output import ChatOutput
from dspark_loop.api.chat.parse import StreamingChatParser, ToolParseError
from tests.unit.api.parse import parse_completion
from tests.unit.api.vectors import PARSE

EXTRA = [
    {
        "name": "content_then_parallel_calls",
        "thinking_mode": "chat",
        "completion": 'Sure.\n\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="w">\n'
        '<｜DSML｜parameter name="city" string="true">Par"is\n<b></｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="n" string="false">[1,  {"a": "é"}]</｜DSML｜parameter>\n'
        '</｜DSML｜invoke>\n<｜DSML｜invoke name="now">\n\n</｜DSML｜invoke>\n'
        "</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
    },
    {
        "name": "near_markers_in_text",
        "thinking_mode": "thinking",
        "completion": "a </thin b \n\n<｜DS c</think>d \n\n<x <｜end▁of e",
    },
]
CASES = PARSE + EXTRA


def fixed_ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter):024x}"


def reassemble(deltas):
    """Concatenate deltas the way an OpenAI client does."""
    reasoning = "".join(d.text for d in deltas if d.kind == "reasoning")
    content = "".join(d.text for d in deltas if d.kind == "content")
    calls: list[dict] = []
    for d in deltas:
        if d.kind != "tool_call":
            continue
        tc = d.tool_call
        if "id" in tc:
            assert tc["index"] == len(calls) and tc["type"] == "function"
            assert "arguments" not in tc["function"]
            calls.append(
                {"id": tc["id"], "type": "function", "function": {"name": tc["function"]["name"], "arguments": ""}}
            )
        else:
            assert set(tc) == {"index", "function"} and tc["index"] == len(calls) - 1
            calls[tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
    return reasoning or None, content or None, calls


def stream(text: str, cuts: list[int], start_in_reasoning: bool):
    parser = StreamingChatParser(start_in_reasoning, call_id=fixed_ids())
    deltas, prev = [], 0
    for cut in cuts + [len(text)]:
        deltas += parser.feed(text[prev:cut])
        prev = cut
    return deltas + parser.finish()


def expected(case):
    msg = parse_completion(
        case["completion"], start_in_reasoning=case["thinking_mode"] == "thinking", call_id=fixed_ids()
    )
    return msg.reasoning_content, msg.content, msg.tool_calls


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_every_split_point_reassembles_to_the_non_streaming_message(case):
    """Feeding the text in two pieces, cut anywhere, must give exactly parse_completion's
    reasoning, content and tool calls (arguments concatenated to the final string)."""
    text, start = case["completion"], case["thinking_mode"] == "thinking"
    want = expected(case)
    for cut in range(len(text) + 1):
        assert reassemble(stream(text, [cut], start)) == want, f"cut at {cut}"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_char_by_char_and_random_chunks_reassemble_too(case):
    """One character at a time and random multi-cut chunkings must give the same message."""
    text, start = case["completion"], case["thinking_mode"] == "thinking"
    want = expected(case)
    assert reassemble(stream(text, list(range(1, len(text))), start)) == want
    rng = random.Random(1)
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(5, len(text))))
        assert reassemble(stream(text, cuts, start)) == want


def test_held_back_tails_never_leak_marker_pieces():
    """No content or reasoning delta may carry a piece of </think>, the tool block opener or
    its "\\n\\n" before the marker is decided."""
    text = PARSE[1]["completion"]
    for d in stream(text, list(range(1, len(text))), True):
        if d.kind != "tool_call":
            assert "<" not in d.text and "\n" not in d.text and "｜" not in d.text


def test_arguments_stream_before_the_parameter_closes():
    """A long string argument must stream in pieces, not arrive only at the closing tag."""
    head = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="echo">\n<｜DSML｜parameter name="text" string="true">'
    parser = StreamingChatParser(False)
    deltas = parser.feed(head)
    deltas += parser.feed("hello ")
    assert deltas[-1].tool_call["function"]["arguments"] == "hello "
    deltas += parser.feed("world</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
    deltas += parser.finish()
    assert json.loads(reassemble(deltas)[2][0]["function"]["arguments"]) == {"text": "hello world"}
    assert parser.tool_calls_complete


def test_a_malformed_stream_raises_and_stays_failed():
    """After a ToolParseError every later feed or finish must raise it again."""
    parser = StreamingChatParser(False)
    parser.feed("ok\n\n<｜DSML｜tool_calls>\n")
    with pytest.raises(ToolParseError):
        parser.feed("not an invoke")
    with pytest.raises(ToolParseError):
        parser.feed("more")
    with pytest.raises(ToolParseError):
        parser.finish()


def test_openai_delta_shapes():
    """ChatOutput's deltas, fed a character at a time, must carry the choices[].delta fields
    clients read: reasoning first, then tool-call fragments only."""
    out = ChatOutput(True)
    deltas = [d for d in [out.feed(ch) for ch in PARSE[1]["completion"]] + [out.finish()] if d]
    kinds = [set(d) for d in deltas]
    n = kinds.index({"tool_calls"})
    assert all(k == {"reasoning_content", "reasoning"} for k in kinds[:n])
    assert all(k == {"tool_calls"} for k in kinds[n:])
    assert "".join(d["reasoning_content"] for d in deltas[:n]) == PARSE[1]["message"]["reasoning_content"]
    assert deltas[n]["tool_calls"][0]["function"]["name"] == "get_weather"
