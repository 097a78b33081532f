"""ChatOutput: engine text -> OpenAI deltas and message; and the engine text it relies on
(the parser's markers kept as text, other special tokens dropped)."""

from __future__ import annotations

import json

import pytest

from dspark_loop.api.chat.output import ChatOutput
from dspark_loop.api.chat.render import CHAT_MARKERS
from dspark_loop.engine.detokenize import Detokenizer, TokenText
from dspark_testing.tiny_tokenizer import tiny_tokenizer

D = "｜DSML｜"
CALL = (
    f'<{D}invoke name="f">\n<{D}parameter name="a" string="true">x y</{D}parameter>\n'
    f'<{D}parameter name="b" string="false">[1, 2]</{D}parameter>\n</{D}invoke>'
)
TEXT = f"think hard</think>Sure.\n\n<{D}tool_calls>\n{CALL}\n{CALL}\n</{D}tool_calls>"


def ids_counter():
    n = iter(range(100))
    return lambda: f"call_{next(n)}"


def run(text: str, cuts: list[int], **kw) -> tuple[list[dict], ChatOutput]:
    out = ChatOutput(True, call_id=ids_counter(), **kw)
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    deltas = [out.feed(p) for p in pieces] + [out.finish()]
    return [d for d in deltas if d], out


def joined(deltas: list[dict]) -> dict:
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            c = calls.setdefault(tc["index"], {"name": None, "arguments": ""})
            c["name"] = tc["function"].get("name", c["name"])
            c["arguments"] += tc["function"].get("arguments", "")
    return {
        "reasoning": "".join(d.get("reasoning_content", "") for d in deltas),
        "content": "".join(d.get("content", "") for d in deltas),
        "calls": [calls[i] for i in sorted(calls)],
    }


@pytest.mark.parametrize("step", [1, 2, 3, 7, 50])
def test_any_split_of_the_text_streams_to_the_same_message(step):
    """However the text is cut into deltas, the streamed pieces must join to the whole
    message: reasoning, content, and calls with JSON object arguments."""
    deltas, out = run(TEXT, list(range(step, len(TEXT), step)))
    msg = out.message()
    assert joined(deltas) == {
        "reasoning": "think hard",
        "content": "Sure.",
        "calls": [{"name": "f", "arguments": c["function"]["arguments"]} for c in msg["tool_calls"]],
    }
    assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == [{"a": "x y", "b": [1, 2]}] * 2
    assert msg["reasoning_content"] == msg["reasoning"] == "think hard"
    assert out.finish_reason("stop") == "tool_calls" and out.finish_reason("length") == "length"


def test_one_delta_merges_a_calls_header_and_arguments():
    """Fed at once, a call must arrive as one tool_calls entry with id, type, name and the
    whole arguments string."""
    deltas, _ = run(TEXT, [])
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert [tc["index"] for tc in calls] == [0, 1]
    assert calls[0]["id"] == "call_0" and calls[0]["type"] == "function"
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": "x y", "b": [1, 2]}


def test_single_call_mode_drops_later_calls_and_still_finishes_with_tool_calls():
    """parallel_tool_calls=false must stream and report only call 0, complete."""
    deltas, out = run(TEXT, list(range(5, len(TEXT), 5)), parallel_tool_calls=False)
    assert [c["name"] for c in joined(deltas)["calls"]] == ["f"]
    assert len(out.message()["tool_calls"]) == 1 and out.truncated_calls == 1
    assert out.finish_reason("stop") == "tool_calls"


def test_a_cut_block_lists_its_call_as_far_as_written_and_keeps_the_engine_reason():
    """A block cut inside a call must list the call as the stream sent it (its arguments cut
    short) and keep the engine's finish reason; cut before the call's name, the block's raw
    text is the content (never an empty answer), streamed and whole alike."""
    cut = TEXT[: TEXT.index("</｜DSML｜invoke>")]
    for step in (1, 7, len(cut)):
        deltas, out = run(cut, list(range(step, len(cut), step)))
        calls = out.message()["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["f"]
        assert calls[0]["function"]["arguments"] == '{"a": "x y", "b": [1, 2]'
        assert joined(deltas)["calls"] == [{"name": "f", "arguments": calls[0]["function"]["arguments"]}]
        assert out.finish_reason("stop") == "stop" and out.finish_reason("length") == "length"
    nameless = TEXT[: TEXT.index('name="f"') + 7]  # cut inside the first call's name
    block = nameless[nameless.index("\n\n<｜DSML｜tool_calls>") :]  # as written, its blank line too
    for step in (1, 5, len(nameless)):
        deltas, out = run(nameless, list(range(step, len(nameless), step)))
        assert "tool_calls" not in out.message() and out.message()["content"] == "Sure." + block
        assert joined(deltas)["content"] == "Sure." + block and out.finish_reason("stop") == "stop"


def detok_text(ids: list[int], skip: bool, keep: tuple[str, ...] = ()) -> str:
    det = Detokenizer(TokenText(tiny_tokenizer()), skip_special_tokens=skip, keep_special=keep)
    for t in ids:
        det.add(t)
    return det.take_delta() + det.finish()


def test_detokenizer_keeps_special_tokens_as_text_only_when_asked():
    """skip_special_tokens=False must spell </think> and ｜DSML｜ in the text (the chat
    parser reads them); the default must drop them."""
    tok = tiny_tokenizer()
    text = f"a é</think>b<{D}tool_calls>"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert detok_text(ids, skip=False) == text
    assert detok_text(ids, skip=True) == "a éb<tool_calls>"


def test_chat_text_spells_the_parser_markers_and_drops_every_other_special_token():
    """keep_special=CHAT_MARKERS (what the chat route asks for): </think> and ｜DSML｜ stay
    as text for the parser, a placeholder or a turn marker the model wrote does not reach
    the answer; the one-token path (add) and the plain path (feed) agree."""
    tok = tiny_tokenizer()
    text = f"a é</think>b<｜Assistant｜><{D}tool_calls><｜place▁holder▁no▁799｜>c"
    ids = tok.encode(text, add_special_tokens=False).ids
    want = f"a é</think>b<{D}tool_calls>c"
    assert detok_text(ids, skip=True, keep=CHAT_MARKERS) == want
    plain = Detokenizer(TokenText(tok), keep_special=CHAT_MARKERS)
    assert plain.plain and plain.feed(ids) == want
