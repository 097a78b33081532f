"""Constrained tool calls at the route: which requests get a grammar, what it allows first,
and the 400s when it cannot be had. xgrammar stays out of the server until needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dspark_loop.api.chat.constraint import needs_constraint
from dspark_loop.api.structured.build import MISSING_XGRAMMAR
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.harness import serving
from tests.unit.api.scripted import chat_engine

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
STRICT = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
HI = [{"role": "user", "content": "hi"}]
NO_THINKING = {"chat_template_kwargs": {"thinking": False}}


@pytest.mark.parametrize(
    "tools, choice, want",
    [
        ([WEATHER], "required", True),
        ([WEATHER], {"type": "function", "function": {"name": "get_weather"}}, True),
        ([STRICT], "auto", True),
        ([STRICT], None, True),
        ([WEATHER], "auto", False),
        ([WEATHER], None, False),
        ([STRICT], "none", False),
        ([], None, False),
    ],
)
def test_grammar_only_for_required_named_or_strict_tools(tools, choice, want):
    """Constrained decoding must be used exactly for required, named, or strict tools under
    auto (the default), never for tool_choice none."""
    assert needs_constraint(tools, choice) is want


async def test_required_tool_choice_attaches_a_mask_that_forces_the_tool_block():
    """tool_choice required (thinking off) must give the engine a constraint whose first
    mask allows neither EOS nor plain text: only a start of "\\n\\n<｜DSML｜tool_calls>"."""
    async with serving(chat_engine()) as client:
        r = await client.post(
            "/v1/chat/completions", json={"messages": HI, "tools": [WEATHER], "tool_choice": "required", **NO_THINKING}
        )
        assert r.status == 200, await r.text()
        constraint = client.engine.requests[0].constraint
    tok = tiny_tokenizer()
    mask = constraint.allowed_token_mask([])
    assert mask.shape == (1024,)
    assert not mask[tok.token_to_id("<｜end▁of▁sentence｜>")]
    assert mask[tok.encode("\n", add_special_tokens=False).ids[0]]
    allowed_text = [tok.decode([i]) for i in mask.nonzero()[0]]
    assert allowed_text and all("\n\n<｜DSML｜tool_calls>".startswith(t) for t in allowed_text)


async def test_plain_auto_tools_decode_unconstrained():
    """tools without strict under auto must not pay for a grammar."""
    async with serving(chat_engine()) as client:
        await client.post("/v1/chat/completions", json={"messages": HI, "tools": [WEATHER]})
        assert client.engine.requests[0].constraint is None


async def test_a_schema_the_grammar_cannot_enforce_is_a_400_before_generation():
    """A JSON Schema keyword the grammar cannot honour (uniqueItems) must answer 400 naming
    `tools` and the keyword when decoding is constrained, and the engine must not be called."""
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
        },
    }
    async with serving(chat_engine()) as client:
        r = await client.post("/v1/chat/completions", json={"messages": HI, "tools": [tool], "tool_choice": "required"})
        out = await r.json()
        assert client.engine.requests == []
    assert r.status == 400 and out["error"]["param"] == "tools"
    assert out["error"]["code"] == "unsupported_tool_schema" and "uniqueItems" in out["error"]["message"]


STRICT_KEYWORDS = {
    "maxLength": {"type": "string", "maxLength": 5},
    "minimum": {"type": "integer", "minimum": 1},
    "pattern": {"type": "string", "pattern": "^[A-Z]+$"},
    "format": {"type": "string", "format": "date"},
    "minItems": {"type": "array", "items": {"type": "string"}, "minItems": 1},
}


@pytest.mark.parametrize("schema", STRICT_KEYWORDS.values(), ids=STRICT_KEYWORDS.keys())
async def test_strict_tools_with_ordinary_schema_keywords_are_accepted(schema):
    """A strict tool whose parameters use maxLength, minimum, pattern, format or minItems
    must be served under the grammar (xgrammar enforces them), not refused."""
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "strict": True,
            "parameters": {"type": "object", "properties": {"a": schema}, "required": ["a"]},
        },
    }
    async with serving(chat_engine()) as client:
        r = await client.post("/v1/chat/completions", json={"messages": HI, "tools": [tool], **NO_THINKING})
        assert r.status == 200, await r.text()
        assert client.engine.requests[0].constraint is not None


async def test_without_xgrammar_constrained_requests_get_a_400_naming_the_extra(monkeypatch):
    """With xgrammar not installed a constrained request must answer 400 telling the user
    to install dspark-loop[tools]; unconstrained requests keep working."""
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar -> ImportError
    monkeypatch.delitem(sys.modules, "dspark_loop.api.structured.grammar_constraint", raising=False)
    monkeypatch.delitem(sys.modules, "dspark_loop.api.structured.compiler", raising=False)
    async with serving(chat_engine()) as client:
        r = await client.post(
            "/v1/chat/completions", json={"messages": HI, "tools": [WEATHER], "tool_choice": "required"}
        )
        out = await r.json()
        ok = await client.post("/v1/chat/completions", json={"messages": HI, "tools": [WEATHER]})
        assert ok.status == 200
    assert r.status == 400 and MISSING_XGRAMMAR in out["error"]["message"]


def test_starting_the_server_imports_neither_torch_nor_xgrammar():
    """The HTTP app and the launcher must not import torch or xgrammar (they come only with
    a constrained request)."""
    code = (
        "import sys, dspark_loop.api.app, dspark_loop.launch, dspark_loop.config.cli; "
        "print(sorted(m for m in ('torch', 'xgrammar') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("field", [{"ignore_eos": True}, {"min_tokens": 3}])
async def test_tokens_forced_past_the_grammar_are_refused_for_constrained_requests(field):
    """ignore_eos and min_tokens would force tokens after the grammar's EOS: a constrained
    request asking for them must get a 400 naming the field."""
    async with serving(chat_engine()) as client:
        r = await client.post(
            "/v1/chat/completions", json={"messages": HI, "tools": [WEATHER], "tool_choice": "required", **field}
        )
        out = await r.json()
    assert r.status == 400 and out["error"]["param"] == next(iter(field))
