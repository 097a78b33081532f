"""ToolGrammar: declared tools + tool_choice -> an EBNF (xgrammar dialect) for the DSML block.

    root   ::= "\\n\\n<｜DSML｜tool_calls>\\n" invoke ("\\n" invoke)* "\\n</｜DSML｜tool_calls>"
    invoke ::= "<｜DSML｜invoke name=\\"N\\">\\n" params_N "\\n</｜DSML｜invoke>"
    param  ::= "<｜DSML｜parameter name=\\"k\\" string=\\"true\\">" raw "</｜DSML｜parameter>"
             | "<｜DSML｜parameter name=\\"k\\" string=\\"false\\">" json "</｜DSML｜parameter>"

Properties come in schema order, required ones mandatory. String values are raw text
without `<`; other values compact JSON whose strings hold no `<` either, so nothing inside a
value can open or close a tag. tool_choice "auto" lets free text run until the block opener.
"""

from __future__ import annotations

import json
import re

from dspark_loop.api.chat.render import DSML, INVOKE_END, PARAMETER_END, TOOL_CALLS_END, TOOL_CALLS_START

ANNOTATIONS = {
    "description",
    "title",
    "default",
    "examples",
    "$schema",
    "$comment",
    "additionalProperties",
    "strict",
    "deprecated",
    "readOnly",
    "writeOnly",
}
STRUCTURE = {"type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf"}
JSON_RULES = r"""
json_string ::= "\"" ( [^"\\<\x00-\x1f] | "\\" ["\\/bfnrt] | "\\u" [0-9a-fA-F]{4} ){REP} "\""
json_integer ::= "-"? ( "0" | [1-9] [0-9]{REP} )
json_number ::= json_integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
json_boolean ::= "true" | "false"
json_null ::= "null"
json_value ::= json_string | json_number | json_boolean | json_null | json_array | json_object
json_array ::= "[" ( json_value ( ", " json_value ){REP} )? "]"
json_object ::= "{" ( json_string ": " json_value ( ", " json_string ": " json_value ){REP} )? "}"
raw_text ::= [^<]{REP}
"""


class UnsupportedToolSchema(ValueError):
    pass


def lit(text: str) -> str:
    """`text` as an EBNF string literal."""
    return json.dumps(text, ensure_ascii=False)


class _Builder:
    def __init__(self, max_value_len: int | None):
        self.rep = "*" if max_value_len is None else f"{{0,{max_value_len}}}"
        self.rules: dict[str, str] = {}

    def add(self, stem: str, body: str) -> str:
        name = f"{stem}_{len(self.rules)}"
        self.rules[name] = body
        return name

    def types(self, schema: dict, where: str) -> list[str]:
        unknown = set(schema) - ANNOTATIONS - STRUCTURE
        if unknown:
            raise UnsupportedToolSchema(
                f"{where}: JSON Schema keyword(s) {sorted(unknown)} cannot be enforced by the tool-call grammar"
            )
        t = schema.get("type")
        return [t] if isinstance(t, str) else list(t or [])

    def value(self, schema: dict, where: str, *, strings: bool = True) -> str | None:
        """Rule for a JSON value of `schema`; strings=False leaves the string branch out.
        None when the schema admits nothing."""
        types = self.types(schema, where)
        if "const" in schema or "enum" in schema:
            options = [schema["const"]] if "const" in schema else schema["enum"]
            keep = [o for o in options if strings or not isinstance(o, str)]
            if any(isinstance(o, str) and "<" in o for o in keep):
                raise UnsupportedToolSchema(f"{where}: enum values may not contain '<'")
            return self.add("enum", " | ".join(lit(json.dumps(o, ensure_ascii=False)) for o in keep)) if keep else None
        for key in ("anyOf", "oneOf"):
            if key in schema:
                found = [self.value(s, f"{where}.{key}[{i}]", strings=strings) for i, s in enumerate(schema[key])]
                alts = [a for a in found if a]
                return self.add("any", " | ".join(alts)) if alts else None
        if not types:
            return (
                "json_value"
                if strings
                else self.add("nonstr", "json_number | json_boolean | json_null | json_array | json_object")
            )
        alts = []
        for t in types:
            if t == "string" and strings:
                alts.append("json_string")
            elif t in ("integer", "number", "boolean", "null"):
                alts.append(f"json_{t}")
            elif t == "array":
                items = self.value(schema.get("items") or {}, f"{where}.items")
                alts.append(self.add("array", f'"[" ( {items} ( ", " {items} ){self.rep} )? "]"'))
            elif t == "object":
                alts.append(self.object(schema, where) if schema.get("properties") else "json_object")
            elif t != "string":
                raise UnsupportedToolSchema(f"{where}: unknown type {t!r}")
        return self.add("value", " | ".join(alts)) if alts else None

    def object(self, schema: dict, where: str) -> str:
        def field(key: str, sub: dict, w: str) -> str:
            value = self.value(sub, w)
            if value is None:
                raise UnsupportedToolSchema(f"{w}: the schema admits no value")
            return f"{lit(json.dumps(key, ensure_ascii=False) + ': ')} {value}"

        return self.add("object", f'"{{" {self.fields(schema, where, field, lit(", "))} "}}"')

    def string_options(self, schema: dict, where: str) -> list[str] | None:
        """Raw string alternatives of `schema`: ["raw_text"], literals from an enum, or None."""
        types = self.types(schema, where)
        if "const" in schema or "enum" in schema:
            options = [o for o in ([schema["const"]] if "const" in schema else schema["enum"]) if isinstance(o, str)]
            if any("<" in o for o in options):
                raise UnsupportedToolSchema(f"{where}: enum values may not contain '<'")
            return [lit(o) for o in options] or None
        for key in ("anyOf", "oneOf"):
            if key in schema:
                found = [self.string_options(s, f"{where}.{key}[{i}]") for i, s in enumerate(schema[key])]
                return ["raw_text"] if ["raw_text"] in found else [o for f in found if f for o in f] or None
        return ["raw_text"] if not types or "string" in types else None

    def param(self, key: str, schema: dict, where: str) -> str:
        head = f'<{DSML}parameter name="{key}" string='
        alts = []
        raw = self.string_options(schema, where)
        if raw:
            alts.append(lit(head + '"true">') + " ( " + " | ".join(raw) + " )")
        rest = self.value(schema, where, strings=False)
        if rest:
            alts.append(lit(head + '"false">') + " " + rest)
        if not alts:
            raise UnsupportedToolSchema(f"{where}: the schema admits no value")
        return self.add("param", "( " + " | ".join(alts) + f" ) {lit(PARAMETER_END)}")

    def fields(self, schema: dict, where: str, make, sep: str) -> str:
        """Properties in order: required ones always, optional ones maybe, `sep` between."""
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        for key in required - set(props):
            raise UnsupportedToolSchema(f"{where}: required property {key!r} has no schema")
        for key in props:
            if not re.fullmatch(r'[^"<>\n\\]+', key):
                raise UnsupportedToolSchema(f"{where}: property name {key!r} cannot be a parameter name")
        items = [(make(k, s, f"{where}.properties.{k}"), k in required) for k, s in props.items()]
        # first_i: nothing written yet; rest_i: something written, so `sep` comes first.
        first, rest = '""', '""'
        for rule, req in reversed(items):
            new_rest = f"{sep} {rule} {rest}" if req else f"( {sep} {rule} )? {rest}"
            new_first = f"{rule} {rest}" if req else f"( {rule} {rest} | {first} )"
            rest, first = self.add("rest", new_rest), self.add("first", new_first)
        return first


def tool_call_grammar(
    tools: list[dict], tool_choice, *, parallel_tool_calls: bool = True, max_value_len: int | None = None
) -> str:
    """EBNF admitting exactly the tool blocks `tool_choice` allows (then EOS ends the turn).

    tool_choice: "required" (one or more calls of declared tools), "auto" (free text, and a
    block only of declared tools), or {"type": "function", "function": {"name": N}} (one call
    of N). max_value_len bounds string/number lengths and array sizes (None: unbounded).
    """
    b = _Builder(max_value_len)
    named = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    chosen = [t for t in tools if named is None or t["function"]["name"] == named]
    if not chosen:
        raise UnsupportedToolSchema(f"tool_choice {tool_choice!r} selects no declared tool")
    invokes = []
    for tool in chosen:
        fn = tool["function"]
        schema = fn.get("parameters") or {"type": "object", "properties": {}}
        where = f"tool {fn['name']!r} parameters"
        if b.types(schema, where) not in ([], ["object"]):
            raise UnsupportedToolSchema(f"{where}: must be an object schema")
        params = b.fields(schema, where, b.param, lit("\n"))
        head = f'<{DSML}invoke name="{fn["name"]}">\n'
        invokes.append(b.add("invoke", f"{lit(head)} {params} {lit(chr(10) + INVOKE_END)}"))
    invoke = " | ".join(invokes)
    more = "" if named or not parallel_tool_calls else f' ( "\\n" ( {invoke} ) ){b.rep}'
    block = f'"\\n" ( {invoke} ){more} {lit(chr(10) + TOOL_CALLS_END)}'
    if tool_choice == "auto":
        root = (
            f"root ::= TagDispatch(({lit(TOOL_CALLS_START)}, tool_block), "
            "loop_after_dispatch=false)\ntool_block ::= " + block
        )
    else:
        root = f"root ::= {lit(chr(10) * 2 + TOOL_CALLS_START)} {block}"
    lines = [root] + [f"{name} ::= {body}" for name, body in _reachable(b.rules, root).items()]
    return "\n".join(lines) + JSON_RULES.replace("{REP}", b.rep)


def _reachable(rules: dict[str, str], root: str) -> dict[str, str]:
    """The builder's rules that `root` uses (the unused first_/rest_ links are dropped)."""
    seen: dict[str, str] = {}
    todo = [root]
    while todo:
        for name in re.findall(r"\b[a-z]+_\d+\b", todo.pop()):
            if name in rules and name not in seen:
                seen[name] = rules[name]
                todo.append(rules[name])
    return dict(sorted(seen.items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1])))
