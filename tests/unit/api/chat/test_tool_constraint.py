"""tool_call_grammar + ToolConstraint: masked decoding can only write valid DSML tool calls."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xgrammar as xg
from tokenizers import Tokenizer

from dspark_loop.api.chat.tool_constraint import ToolConstraint
from dspark_loop.api.chat.tool_grammar import UnsupportedToolSchema, tool_call_grammar
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.parse import parse_completion

VOCAB = 1024
EOS_ID, THINK_END_ID, DSML_ID = 1, 5, 6
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "required": ["city"],
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "days": {"type": "integer"},
                "unit": {"enum": ["c", "f"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "hourly": {"type": "boolean"},
                "ratio": {"type": ["number", "null"]},
            },
        },
    },
}
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, NOW]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    t = tiny_tokenizer()
    assert (t.token_to_id("<｜end▁of▁sentence｜>"), t.token_to_id("</think>"), t.token_to_id("｜DSML｜")) == (
        EOS_ID,
        THINK_END_ID,
        DSML_ID,
    )
    return t


def greedy_random(
    c: ToolConstraint, seed: int, *, force: dict[int, int] | None = None, max_steps: int = 800
) -> list[int]:
    """Argmax over random logits masked by the constraint, until EOS."""
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    for step in range(max_steps):
        mask = c.allowed_token_mask(ids)
        logits = rng.standard_normal(VOCAB)
        if force and step in force:
            logits[force[step]] = 1e9
        logits[~mask] = -np.inf
        ids.append(int(np.argmax(logits)))
        assert c.accept(ids[-1])
        if ids[-1] == EOS_ID:
            return ids
    raise AssertionError("constrained stream never ended")


def check_call(call: dict) -> None:
    """The call must name a declared tool and fit its schema."""
    args = json.loads(call["function"]["arguments"])
    name = call["function"]["name"]
    assert name in ("get_weather", "now")
    if name == "now":
        assert args == {}
        return
    assert isinstance(args["city"], str) and "<" not in args["city"]
    assert set(args) <= set(WEATHER["function"]["parameters"]["properties"])
    assert isinstance(args.get("days", 0), int) and not isinstance(args.get("days"), bool)
    assert args.get("unit", "c") in ("c", "f")
    assert all(isinstance(t, str) for t in args.get("tags", []))
    assert isinstance(args.get("hourly", True), bool)
    assert args.get("ratio") is None or isinstance(args["ratio"], (int, float))


@pytest.mark.parametrize("seed", range(8))
def test_random_tokens_under_required_parse_into_valid_calls(tok, seed):
    """Whatever the logits, the masked stream must decode to a complete block of valid calls."""
    c = ToolConstraint.build(tok, TOOLS, "required", start_in_reasoning=False, max_value_len=6)
    ids = greedy_random(c, seed)
    assert c.is_terminated()
    msg = parse_completion(tok.decode(ids, skip_special_tokens=False), start_in_reasoning=False)
    assert msg.content is None and msg.tool_calls and msg.tool_calls_complete
    for call in msg.tool_calls:
        check_call(call)


@pytest.mark.parametrize("seed", range(4))
def test_a_named_tool_choice_gives_exactly_one_call_of_that_tool(tok, seed):
    """tool_choice naming a function must produce one call of it, required params present."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    c = ToolConstraint.build(tok, TOOLS, choice, start_in_reasoning=False, max_value_len=6)
    msg = parse_completion(tok.decode(greedy_random(c, seed), skip_special_tokens=False), start_in_reasoning=False)
    assert [t["function"]["name"] for t in msg.tool_calls] == ["get_weather"]
    check_call(msg.tool_calls[0])


def test_parallel_calls_off_allows_one_call(tok):
    """parallel_tool_calls=false must close the block after one invoke."""
    for seed in range(4):
        c = ToolConstraint.build(
            tok, TOOLS, "required", start_in_reasoning=False, parallel_tool_calls=False, max_value_len=6
        )
        msg = parse_completion(tok.decode(greedy_random(c, seed), skip_special_tokens=False), start_in_reasoning=False)
        assert len(msg.tool_calls) == 1


def test_thinking_mode_reasons_freely_then_must_call(tok):
    """Before </think> any token but ｜DSML｜ and EOS may come; after it only the block."""
    c = ToolConstraint.build(tok, TOOLS, "required", start_in_reasoning=True, max_value_len=6)
    mask = c.allowed_token_mask([])
    assert not mask[EOS_ID] and not mask[DSML_ID] and mask.sum() == VOCAB - 2
    ids = greedy_random(c, 3, force={12: THINK_END_ID})
    assert ids[12] == THINK_END_ID
    msg = parse_completion(tok.decode(ids, skip_special_tokens=False), start_in_reasoning=True)
    assert msg.reasoning_content and msg.content is None and msg.tool_calls
    for call in msg.tool_calls:
        check_call(call)


def test_auto_allows_plain_text_or_a_valid_block(tok):
    """tool_choice auto must allow EOS and text at once, and constrain a block once opened."""
    thinking = ToolConstraint.build(tok, TOOLS, "auto", start_in_reasoning=True)
    assert thinking.allowed_token_mask([])[EOS_ID]
    c = ToolConstraint.build(tok, TOOLS, "auto", start_in_reasoning=False, max_value_len=6)
    mask = c.allowed_token_mask([])
    assert mask[EOS_ID] and mask.sum() > VOCAB // 2
    opener = tok.encode("Sure.\n\n<｜DSML｜tool_calls>", add_special_tokens=False).ids
    rng = np.random.default_rng(0)
    ids = list(opener)
    while not ids or ids[-1] != EOS_ID:
        logits = rng.standard_normal(VOCAB)
        logits[~c.allowed_token_mask(ids)] = -np.inf
        ids.append(int(np.argmax(logits)))
    msg = parse_completion(tok.decode(ids, skip_special_tokens=False), start_in_reasoning=False)
    assert msg.content == "Sure." and msg.tool_calls
    for call in msg.tool_calls:
        check_call(call)


def test_rejected_drafts_roll_back_to_the_same_mask(tok):
    """A history that diverges (rejected speculative drafts) must give the mask a fresh
    constraint gives for that history."""
    c = ToolConstraint.build(tok, TOOLS, "required", start_in_reasoning=False, max_value_len=6)
    ids = greedy_random(c, 1)
    fresh = ToolConstraint.build(tok, TOOLS, "required", start_in_reasoning=False, max_value_len=6)
    for keep in (len(ids) - 2, len(ids) - 5, len(ids) // 2, 3):
        got = c.allowed_token_mask(ids[:keep])
        assert np.array_equal(got, fresh.allowed_token_mask(ids[:keep]))
    before = c.allowed_token_mask(ids[:3])
    assert not before[EOS_ID] and not c.accept(EOS_ID)  # the block is not closed yet
    assert np.array_equal(c.allowed_token_mask(ids[:3]), before)


UNSUPPORTED = {
    "pattern": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}},
    "$ref": {"type": "object", "properties": {"a": {"$ref": "#/defs/a"}}},
    "minimum": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1}}},
    "not an object": {"type": "array"},
    "required without schema": {"type": "object", "properties": {}, "required": ["a"]},
    "enum with <": {"type": "object", "properties": {"a": {"enum": ["<b>"]}}},
}


@pytest.mark.parametrize("schema", UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
def test_schemas_the_grammar_cannot_enforce_are_refused(schema):
    """A schema the grammar cannot enforce must raise UnsupportedToolSchema up front."""
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    with pytest.raises(UnsupportedToolSchema):
        tool_call_grammar([tool], "required")


def test_every_grammar_compiles_and_admits_the_rendered_form():
    """The EBNF must compile, and the encoder's own rendering of a call must match it."""
    from dspark_loop.api.chat.render import EOS, render_tool_block

    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 1, "tags": ["a", "b"]}}}
    text = render_tool_block([call])
    for choice in ("required", "auto", {"type": "function", "function": {"name": "get_weather"}}):
        grammar = tool_call_grammar(TOOLS, choice)
        info = xg.TokenizerInfo([b"x"], xg.VocabType.RAW, stop_token_ids=[0])
        matcher = xg.GrammarMatcher(xg.GrammarCompiler(info).compile_grammar(grammar))
        assert matcher.accept_string(text) and matcher.is_completed(), choice
        assert EOS not in text
