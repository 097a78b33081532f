"""ToolGrammar: declared tools + tool_choice -> an xgrammar structural tag for the DSML block.

    "\\n\\n<｜DSML｜tool_calls>\\n" invoke ("\\n" invoke)* "\\n</｜DSML｜tool_calls>"
    invoke ::= "<｜DSML｜invoke name=\\"N\\">\\n" params "\\n</｜DSML｜invoke>"

The parameters are xgrammar's own JSON-schema compiler in its "deepseek_xml" style:
`<｜DSML｜parameter name="k" string="true">raw text</｜DSML｜parameter>` for strings,
`string="false"` with JSON for the rest, properties in schema order, required ones
mandatory. Whatever JSON Schema xgrammar enforces is enforced here too (schema_support
refuses the keywords it would skip). NOTE: no value may contain `｜DSML｜` (the excludes),
so nothing inside a value can open or close a tag (a `pattern`/`format` string is matched by
its own rule alone). tool_choice "auto" lets free text run until the block opener.
"""

from __future__ import annotations

from xgrammar.structural_tag import (
    ConstStringFormat,
    JSONSchemaFormat,
    SequenceFormat,
    StructuralTag,
    TagFormat,
    TagsWithSeparatorFormat,
    TriggeredTagsFormat,
)

from dspark_loop.api.chat.render import DSML, INVOKE_END, TOOL_CALLS_END, TOOL_CALLS_START
from dspark_loop.api.structured.schema_support import UnsupportedSchema, check_schema

EMPTY_PARAMETERS = {"type": "object", "properties": {}}
# NOTE: whitespace between parameters (and inside JSON values) is bounded: an unbounded run
# lets a weak model spend its whole max_tokens on newlines inside an open block.
MAX_SPACE = 2
NESTED = ("properties", "patternProperties", "$defs", "definitions")
NESTED_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
NESTED_ONE = ("items", "additionalProperties")


def bounded_as_patterns(schema):
    """A copy with every length-bounded string turned into a pattern without `｜`.

    NOTE: xgrammar drops minLength/maxLength from a string filtered by `excludes` (it warns),
    but matches a pattern string by the pattern alone; `[^｜]{m,n}` keeps both the length
    and the rule that no value holds `｜DSML｜` (`｜` only occurs in special tokens)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if ("minLength" in out or "maxLength" in out) and "pattern" not in out and "format" not in out:
        lo, hi = out.pop("minLength", 0), out.pop("maxLength", "")
        out["pattern"] = f"^[^｜]{{{lo},{hi}}}$"
    for key in NESTED:
        if isinstance(out.get(key), dict):
            out[key] = {k: bounded_as_patterns(v) for k, v in out[key].items()}
    for key in NESTED_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [bounded_as_patterns(v) for v in out[key]]
    for key in NESTED_ONE:
        if isinstance(out.get(key), dict):
            out[key] = bounded_as_patterns(out[key])
    return out


def tool_parameters(tool: dict) -> dict:
    """The tool's parameter schema, checked (UnsupportedSchema names the keyword)."""
    fn = tool["function"]
    schema = fn.get("parameters") or EMPTY_PARAMETERS
    where = f"tools[{fn['name']!r}].function.parameters"
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise UnsupportedSchema(where, "type", 'must be "object" for a tool\'s parameters')
    check_schema(schema, where)
    return bounded_as_patterns(schema)


def tool_call_tag(tools: list[dict], tool_choice, *, parallel_tool_calls: bool = True) -> StructuralTag:
    """The structural tag admitting exactly the tool blocks `tool_choice` allows.

    tool_choice: "required" (one or more calls of declared tools), "auto" (free text, and a
    block only of declared tools), or {"type": "function", "function": {"name": N}} (one
    call of N)."""
    named = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    chosen = [t for t in tools if named is None or t["function"]["name"] == named]
    if not chosen:
        raise UnsupportedSchema("tool_choice", "function", f"{named!r} names no declared tool")
    invokes = [
        TagFormat(
            begin=f'<{DSML}invoke name="{t["function"]["name"]}">\n',
            content=JSONSchemaFormat(
                json_schema=tool_parameters(t), style="deepseek_xml", excludes=[DSML], max_whitespace_cnt=MAX_SPACE
            ),
            end=f"\n{INVOKE_END}",
        )
        for t in chosen
    ]
    calls = TagsWithSeparatorFormat(
        tags=invokes, separator="\n", at_least_one=True, stop_after_first=bool(named) or not parallel_tool_calls
    )
    if tool_choice == "auto":
        block = TagFormat(begin=TOOL_CALLS_START + "\n", content=calls, end=f"\n{TOOL_CALLS_END}")
        auto = TriggeredTagsFormat(triggers=[TOOL_CALLS_START], tags=[block], stop_after_first=True)
        return StructuralTag(format=auto)
    return StructuralTag(
        format=SequenceFormat(
            elements=[
                ConstStringFormat(value=f"\n\n{TOOL_CALLS_START}\n"),
                calls,
                ConstStringFormat(value=f"\n{TOOL_CALLS_END}"),
            ]
        )
    )
