"""A whole completion through ChatOutput (message, finish_reason): the release vectors,
argument typing, malformed blocks."""

from __future__ import annotations

import json
import random
import re

import pytest

from dspark_loop.api.chat.parse import ToolParseError, new_call_id
from tests.unit.api.parse import parse_completion
from tests.unit.api.vectors import PARSE

CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")
OPEN = "\n\n<｜DSML｜tool_calls>\n"
CLOSE = "\n</｜DSML｜tool_calls>"


def invoke(name: str, *params: str) -> str:
    return f'<｜DSML｜invoke name="{name}">\n' + "\n".join(params) + "\n</｜DSML｜invoke>"


def param(name: str, value: str, string: bool) -> str:
    flag = "true" if string else "false"
    return f'<｜DSML｜parameter name="{name}" string="{flag}">{value}</｜DSML｜parameter>'


@pytest.mark.parametrize("vector", PARSE, ids=[v["name"] for v in PARSE])
def test_every_parse_vector_parses_to_its_message(vector):
    """Content, reasoning, call names and parsed arguments must match the release parser;
    ids must be fresh call_<hex> ids."""
    msg = parse_completion(vector["completion"], start_in_reasoning=vector["thinking_mode"] == "thinking")
    want = vector["message"]
    assert (msg.content or "") == want["content"]
    assert (msg.reasoning_content or "") == want["reasoning_content"]
    assert [c["function"]["name"] for c in msg.tool_calls] == [c["function"]["name"] for c in want["tool_calls"]]
    for got, ref in zip(msg.tool_calls, want["tool_calls"]):
        assert json.loads(got["function"]["arguments"]) == json.loads(ref["function"]["arguments"])
        assert got["type"] == "function" and CALL_ID.match(got["id"])
    assert msg.tool_calls_complete


def test_a_pure_tool_call_returns_null_content():
    """A completion that is only a tool block must give content None, as OpenAI does."""
    msg = parse_completion(OPEN + invoke("now") + CLOSE, start_in_reasoning=False)
    assert msg.content is None and msg.message()["content"] is None


def test_string_flags_decide_argument_types():
    """string="true" values must stay JSON strings (even if they look like numbers);
    string="false" values must be parsed JSON."""
    text = (
        OPEN
        + invoke(
            "f",
            param("a", "42", True),
            param("b", "42", False),
            param("c", '{"k": [1, 2.5, null]}', False),
            param("d", 'line "one"\n<b>two</b>', True),
            param("e", "true", False),
        )
        + CLOSE
    )
    args = json.loads(parse_completion(text, start_in_reasoning=False).tool_calls[0]["function"]["arguments"])
    assert args == {"a": "42", "b": 42, "c": {"k": [1, 2.5, None]}, "d": 'line "one"\n<b>two</b>', "e": True}


def test_parallel_calls_keep_their_order_and_get_distinct_ids():
    """Several invokes in one block must come back in order, each with its own id."""
    text = (
        "Checking both."
        + OPEN
        + invoke("w", param("city", "Paris", True))
        + "\n"
        + invoke("w", param("city", "Rome", True))
        + CLOSE
        + "<｜end▁of▁sentence｜>"
    )
    msg = parse_completion(text, start_in_reasoning=False)
    assert msg.content == "Checking both."
    assert [json.loads(c["function"]["arguments"])["city"] for c in msg.tool_calls] == ["Paris", "Rome"]
    assert len({c["id"] for c in msg.tool_calls}) == 2


def test_a_tool_block_ends_reasoning_without_a_think_close():
    """A tool block opened inside reasoning must end the reasoning there."""
    msg = parse_completion("plan it" + OPEN + invoke("now") + CLOSE, start_in_reasoning=True)
    assert msg.reasoning_content == "plan it" and msg.content is None
    assert msg.tool_calls[0]["function"]["name"] == "now"


def test_text_after_eos_is_ignored_and_unfinished_reasoning_stays_reasoning():
    """EOS must end the message; reasoning cut short must not turn into content."""
    assert parse_completion("a<｜end▁of▁sentence｜>b", start_in_reasoning=False).content == "a"
    msg = parse_completion("still thinking", start_in_reasoning=True)
    assert (msg.reasoning_content, msg.content) == ("still thinking", None)


def test_near_markers_that_never_complete_stay_text():
    """A tail that only looks like the start of a marker must be returned as text."""
    for tail in ("</thi", "\n\n<｜DSML｜tool", "\n\n", "<｜end▁of"):
        assert parse_completion("x" + tail, start_in_reasoning=False).content == "x" + tail


@pytest.mark.parametrize("cut", [len(OPEN) - 1, len(OPEN) + 10, len(OPEN) + 60])
def test_a_block_cut_short_is_incomplete_not_an_error(cut):
    """A block cut by max_tokens or a stop string must parse, mark itself incomplete, keep
    finish_reason from saying tool_calls, and return what was written."""
    text = (OPEN + invoke("f", param("q", "some words", True)))[:cut]
    msg = parse_completion(text, start_in_reasoning=False)
    assert not msg.tool_calls_complete
    if cut > len(OPEN) + 30:  # inside the call: listed as far as written
        assert [c["function"]["name"] for c in msg.tool_calls] == ["f"]
        assert '{"q": "some words"}'.startswith(msg.tool_calls[0]["function"]["arguments"])
    else:  # before the call's name: the block's raw text is the content
        assert msg.tool_calls == [] and msg.content == text
    assert msg.finish_reason("stop") == "stop"
    assert msg.finish_reason("length") == "length"


def test_finish_reason_is_tool_calls_only_for_complete_calls_ending_on_stop():
    """Complete calls ending on EOS/stop must give "tool_calls"; plain text keeps "stop"."""
    done = parse_completion(OPEN + invoke("now") + CLOSE, start_in_reasoning=False)
    assert done.finish_reason("stop") == "tool_calls"
    assert done.finish_reason("length") == "length"
    assert parse_completion("hi", start_in_reasoning=False).finish_reason("stop") == "stop"


def test_a_complete_first_call_survives_a_cut_second_call():
    """Closed invokes must be kept whole when a later one is cut short (listed as written)."""
    text = OPEN + invoke("now") + "\n" + invoke("f", param("q", "x", True))[:30]
    msg = parse_completion(text, start_in_reasoning=False)
    assert [c["function"]["name"] for c in msg.tool_calls] == ["now", "f"]
    assert msg.tool_calls[0]["function"]["arguments"] == "{}" and not msg.tool_calls_complete


MALFORMED = {
    "junk instead of invoke": OPEN + "hello" + CLOSE,
    "empty block": OPEN + CLOSE,
    "name without quote close": OPEN + "<｜DSML｜invoke name=now>\n</｜DSML｜invoke>" + CLOSE,
    "bad string flag": OPEN + invoke("f", '<｜DSML｜parameter name="a" string="maybe">1</｜DSML｜parameter>') + CLOSE,
    "non-JSON for string=false": OPEN + invoke("f", param("a", "Paris", False)) + CLOSE,
    "duplicate parameter": OPEN + invoke("f", param("a", "1", False), param("a", "2", False)) + CLOSE,
    "parameter never closed": OPEN + '<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" '
    'string="true">x\n</｜DSML｜invoke>' + CLOSE,
    "text after the block": OPEN + invoke("now") + CLOSE + "and more",
}


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_blocks_raise_tool_parse_error(text):
    """A block of the wrong shape must raise ToolParseError with a message, nothing else."""
    with pytest.raises(ToolParseError, match="malformed tool call block"):
        parse_completion(text, start_in_reasoning=False)


def corruptions(text: str, rng: random.Random, n: int):
    alphabet = ['"', "<", ">", "\n", "｜DSML｜", "</think>", "x", "{", "=", "<｜end▁of▁sentence｜>"]
    for _ in range(n):
        chars = list(text)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(chars) + 1)
            op = rng.random()
            if op < 0.4 and chars:
                del chars[min(i, len(chars) - 1)]
            elif op < 0.8:
                chars.insert(i, rng.choice(alphabet))
            else:
                chars = chars[:i]
        yield "".join(chars)


def test_truncated_or_corrupted_vectors_never_raise_anything_else():
    """Random truncations and corruptions must parse or raise ToolParseError, never crash."""
    rng = random.Random(0)
    extra = OPEN + invoke("f", param("a", "x y", True), param("b", '[1, {"c": 2}]', False)) + CLOSE
    for text in [v["completion"] for v in PARSE] + [extra]:
        for i in range(len(text) + 1):
            for start in (True, False):
                parse_completion(text[:i], start_in_reasoning=start)
        for bad in corruptions(text, rng, 300):
            for start in (True, False):
                try:
                    parse_completion(bad, start_in_reasoning=start)
                except ToolParseError:
                    pass


def test_call_ids_look_like_openai_ids():
    """Generated ids must be call_ followed by hex and differ between calls."""
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100 and all(CALL_ID.match(i) for i in ids)


def test_the_held_tail_is_the_longest_that_could_still_grow_into_a_marker():
    """_held_len against its definition, on texts made of marker fragments (where the
    candidate tails overlap) and plain text."""
    from dspark_loop.api.chat.parse import _held_len
    from dspark_loop.api.chat.render import DSML, EOS, TOOL_CALLS_START

    markers = (EOS, "\n\n" + TOOL_CALLS_START, DSML, "<<a<<b")

    def brute(text: str, ms) -> int:
        return max(
            (k for m in ms for k in range(1, min(len(m) - 1, len(text)) + 1) if m.startswith(text[-k:])), default=0
        )

    rng = random.Random(7)
    pieces = [m[: rng.randrange(1, len(m))] for m in markers for _ in range(4)] + ["x", "<", "\n", "｜", "ab"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 5)))
        ms = tuple(rng.sample(markers, rng.randrange(1, len(markers) + 1)))
        assert _held_len(text, ms) == brute(text, ms), (text, ms)
