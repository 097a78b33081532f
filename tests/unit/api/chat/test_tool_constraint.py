"""tool_call_tag + GrammarConstraint: masked decoding can only write valid DSML tool calls.

The tools' schemas are bounded (maxLength, maximum, maxItems) so that random logits end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xgrammar as xg
from tokenizers import Tokenizer

from dspark_loop.api.chat.tool_grammar import tool_call_tag
from dspark_loop.api.structured.build import tool_constraint
from dspark_loop.api.structured.grammar_constraint import GrammarConstraint
from dspark_loop.api.structured.schema_support import UnsupportedSchema
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
                "city": {"type": "string", "description": "City name", "maxLength": 6},
                "days": {"type": "integer", "minimum": 0, "maximum": 99},
                "unit": {"enum": ["c", "f"]},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
                "hourly": {"type": "boolean"},
                "ratio": {"type": ["integer", "null"], "minimum": -9, "maximum": 9},
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


def build(tok, tools, choice, *, start_in_reasoning=False, parallel_tool_calls=True) -> GrammarConstraint:
    return tool_constraint(
        tok,
        tools,
        choice,
        start_in_reasoning=start_in_reasoning,
        vocab_size=VOCAB,
        parallel_tool_calls=parallel_tool_calls,
    )


def greedy_random(
    c: GrammarConstraint, seed: int, *, force: dict[int, int] | None = None, max_steps: int = 800
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
    assert isinstance(args["city"], str) and len(args["city"]) <= 6 and "｜DSML｜" not in args["city"]
    assert set(args) <= set(WEATHER["function"]["parameters"]["properties"])
    assert isinstance(args.get("days", 0), int) and not isinstance(args.get("days"), bool)
    assert 0 <= args.get("days", 0) <= 99
    assert args.get("unit", "c") in ("c", "f")
    assert all(isinstance(t, str) for t in args.get("tags", []))
    assert isinstance(args.get("hourly", True), bool)
    assert args.get("ratio") is None or -9 <= args["ratio"] <= 9


@pytest.mark.parametrize("seed", range(8))
def test_random_tokens_under_required_parse_into_valid_calls(tok, seed):
    """Whatever the logits, the masked stream must decode to a complete block of valid calls."""
    c = build(tok, TOOLS, "required", start_in_reasoning=False)
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
    c = build(tok, TOOLS, choice, start_in_reasoning=False)
    msg = parse_completion(tok.decode(greedy_random(c, seed), skip_special_tokens=False), start_in_reasoning=False)
    assert [t["function"]["name"] for t in msg.tool_calls] == ["get_weather"]
    check_call(msg.tool_calls[0])


def test_parallel_calls_off_allows_one_call(tok):
    """parallel_tool_calls=false must close the block after one invoke."""
    for seed in range(4):
        c = build(tok, TOOLS, "required", start_in_reasoning=False, parallel_tool_calls=False)
        msg = parse_completion(tok.decode(greedy_random(c, seed), skip_special_tokens=False), start_in_reasoning=False)
        assert len(msg.tool_calls) == 1


def test_thinking_mode_reasons_freely_then_must_call(tok):
    """Before </think> any token but ｜DSML｜ and EOS may come; after it only the block."""
    c = build(tok, TOOLS, "required", start_in_reasoning=True)
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
    thinking = build(tok, TOOLS, "auto", start_in_reasoning=True)
    assert thinking.allowed_token_mask([])[EOS_ID]
    c = build(tok, TOOLS, "auto", start_in_reasoning=False)
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
    c = build(tok, TOOLS, "required", start_in_reasoning=False)
    ids = greedy_random(c, 1)
    fresh = build(tok, TOOLS, "required", start_in_reasoning=False)
    for keep in (len(ids) - 2, len(ids) - 5, len(ids) // 2, 3):
        got = c.allowed_token_mask(ids[:keep])
        assert np.array_equal(got, fresh.allowed_token_mask(ids[:keep]))
    before = c.allowed_token_mask(ids[:3])
    assert not before[EOS_ID] and not c.accept(EOS_ID)  # the block is not closed yet
    assert np.array_equal(c.allowed_token_mask(ids[:3]), before)


UNSUPPORTED = {
    "uniqueItems": {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
    "not": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
    "if": {"type": "object", "properties": {"a": {"if": {"type": "string"}, "then": {"maxLength": 2}}}},
    "format": {"type": "object", "properties": {"a": {"type": "string", "format": "idn-email"}}},
    "multipleOf": {"type": "object", "properties": {"a": {"type": "number", "multipleOf": 0.5}}},
    "type": {"type": "array"},
}


@pytest.mark.parametrize("keyword, schema", UNSUPPORTED.items(), ids=UNSUPPORTED.keys())
def test_schemas_the_grammar_cannot_enforce_are_refused_naming_the_keyword(keyword, schema):
    """A schema keyword xgrammar would skip must raise UnsupportedSchema naming it."""
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    with pytest.raises(UnsupportedSchema) as e:
        tool_call_tag([tool], "required")
    assert e.value.keyword == keyword


def test_every_grammar_compiles_and_admits_the_rendered_form():
    """The tag must compile, and the encoder's own rendering of a call must match it."""
    from dspark_loop.api.chat.render import EOS, render_tool_block

    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 1, "tags": ["a", "b"]}}}
    text = render_tool_block([call])
    for choice in ("required", "auto", {"type": "function", "function": {"name": "get_weather"}}):
        info = xg.TokenizerInfo([b"x"], xg.VocabType.RAW, stop_token_ids=[0])
        compiled = xg.GrammarCompiler(info).compile_structural_tag(tool_call_tag(TOOLS, choice))
        matcher = xg.GrammarMatcher(compiled)
        assert matcher.accept_string(text) and matcher.is_completed(), choice
        assert EOS not in text


def unpack(bits: bytes) -> np.ndarray:
    return np.unpackbits(np.frombuffer(bits, np.uint8), bitorder="little")[:VOCAB].astype(bool)


@pytest.mark.parametrize("think", [False, True])
def test_masks_along_drafts_equal_the_masks_of_the_drafts_taken_one_by_one(tok, think):
    """row_masks(outputs, drafts)[i] must equal the mask a fresh constraint gives after
    outputs + drafts[:i] (drafts as repaired: a row allowing one token only must carry it,
    a refused draft may become the grammar's forced string), every draft but the last row's
    must be allowed, and the list must stop only at the end, at EOS, or at a refused draft;
    the constraint must be left as if only the outputs had been seen."""
    ids = greedy_random(build(tok, TOOLS, "required", start_in_reasoning=think), 5, force={4: THINK_END_ID})
    rng = np.random.default_rng(0)
    c = build(tok, TOOLS, "required", start_in_reasoning=think)
    repaired = 0
    for at in range(0, len(ids) - 1, 5):
        good = ids[at : at + 7]
        bad = [*good[:2], int(rng.integers(VOCAB)), *good[3:]]
        for drafts in (good, bad):
            got = list(drafts)
            masks = c.row_masks(ids[:at], got)
            repaired += got != drafts
            for i, bits in enumerate(masks):
                fresh = build(tok, TOOLS, "required", start_in_reasoning=think)
                assert bits == fresh.row_masks(ids[:at] + got[:i])[0]
                allowed = unpack(bits)
                if i < len(got) and allowed.sum() == 1 and not fresh.is_terminated():
                    assert allowed[got[i]]
                if i < len(masks) - 1:
                    assert allowed[got[i]]
            n = len(masks)
            ended = ids[:at] + got[: n - 1]
            assert n == len(got) + 1 or (ended and ended[-1] == EOS_ID) or not unpack(masks[-1])[got[n - 1]]
    assert repaired


def test_batched_masks_equal_each_requests_own(tok):
    """batch_row_masks over many requests (one batched fill per row index) must give each
    request exactly the masks its own row_masks gives, and leave each at its outputs."""
    ids = greedy_random(build(tok, TOOLS, "required", start_in_reasoning=True), 7, force={3: THINK_END_ID})
    rng = np.random.default_rng(1)
    cuts = [0, 2, 4, 9, 20, 33, len(ids) // 2, len(ids) - 3]
    drafts = [ids[a : a + 7] if k % 2 else [*ids[a : a + 3], int(rng.integers(VOCAB))] for k, a in enumerate(cuts)]
    batch = [build(tok, TOOLS, "required", start_in_reasoning=True) for _ in cuts]
    single = [build(tok, TOOLS, "required", start_in_reasoning=True) for _ in cuts]
    for _ in range(2):  # the second ask starts from where the first left each constraint
        batch_drafts, single_drafts = [list(d) for d in drafts], [list(d) for d in drafts]
        got = GrammarConstraint.batch_row_masks(batch, [ids[:a] for a in cuts], batch_drafts)
        want = [c.row_masks(ids[:a], d) for c, a, d in zip(single, cuts, single_drafts)]
        assert got == want and batch_drafts == single_drafts
