"""OutputFormat: what a request asked its output to be (a JSON object, a JSON schema, a
regular expression or one of several strings).

Two spellings:
- OpenAI's `response_format`: {"type": "text"} (nothing), {"type": "json_object"}, or
  {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}};
- vLLM's `structured_outputs` (its current name; the older `guided_json` was removed in
  vLLM 0.12 and is not accepted here): {"json": schema (object or JSON text)},
  {"json_object": true}, {"regex": pattern} or {"choice": [strings]} (the output is exactly
  one of them). Its other kinds (grammar, structural_tag) are a 400.

Everything here is cheap and runs in accept(): a bad field is a 400 naming it before any
compute; the grammar itself is compiled later, off the loop (constraint.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from dspark_loop.api.errors import ApiError, bad_request, unsupported
from dspark_loop.api.structured.schema_support import UnsupportedSchema, check_schema
from dspark_loop.api.structured.schema_validity import InvalidSchema, check_is_schema

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
KINDS = ("json", "json_object", "regex", "choice")  # structured_outputs' kinds served here
REGEX_META = frozenset("\\^$.|?*+()[]{}/")
ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class OutputFormat:
    schema: dict  # the JSON schema the output must match ({"type": "object"} for json_object)
    param: str  # the request field that asked (named by later 400s)
    strict_mode: bool = True  # no properties beyond the schema's (json_object: any)
    regex: str | None = None  # instead of the schema: the whole output matches this pattern


def output_format(response_format, structured_outputs=None) -> OutputFormat | None:
    """The request's OutputFormat, None for free text; ApiError(400) for a bad field."""
    if response_format is not None and structured_outputs is not None:
        raise bad_request("Give response_format or structured_outputs, not both.", "structured_outputs")
    if structured_outputs is not None:
        return _structured_outputs(structured_outputs)
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise bad_request("response_format must be an object.", "response_format", "invalid_type")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat(ANY_OBJECT, "response_format", strict_mode=False)
    if kind != "json_schema":
        raise bad_request(
            'response_format.type must be "text", "json_object" or "json_schema".', "response_format.type"
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("response_format.json_schema must be an object.", "response_format.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad_request(
            "response_format.json_schema.name must be 1-64 characters of a-z, A-Z, 0-9, _ and -.",
            "response_format.json_schema.name",
        )
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):  # NOTE: 0 == False in Python
        raise bad_request("response_format.json_schema.strict must be a boolean.", "response_format.json_schema.strict")
    schema = spec.get("schema", ANY_OBJECT)
    return _checked(schema, "response_format.json_schema.schema")


def _structured_outputs(so) -> OutputFormat:
    if not isinstance(so, dict):
        raise bad_request("structured_outputs must be an object.", "structured_outputs")
    given = [k for k, v in so.items() if v is not None and v is not False]
    for key in given:
        if key not in KINDS:
            raise unsupported(
                f"structured_outputs.{key}",
                f"structured_outputs.{key} is not supported by this server ({', '.join(KINDS)} are).",
            )
    if len(given) != 1:
        raise bad_request(f"structured_outputs must set exactly one of {', '.join(KINDS)}.", "structured_outputs")
    if given[0] == "regex":
        if not isinstance(so["regex"], str) or not so["regex"]:
            raise bad_request("structured_outputs.regex must be a non-empty string.", "structured_outputs.regex")
        return OutputFormat({}, "structured_outputs.regex", regex=so["regex"])
    if given[0] == "choice":
        options = so["choice"]
        if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
            raise bad_request(
                "structured_outputs.choice must be a non-empty list of non-empty strings.", "structured_outputs.choice"
            )
        return OutputFormat({}, "structured_outputs.choice", regex="|".join(map(regex_literal, options)))
    if given[0] == "json_object":
        if so["json_object"] is not True:
            raise bad_request("structured_outputs.json_object must be true.", "structured_outputs.json_object")
        return OutputFormat(ANY_OBJECT, "structured_outputs.json_object", strict_mode=False)
    schema = so["json"]
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as e:  # RecursionError: nested too deeply to read
            raise bad_request(f"structured_outputs.json is not JSON: {e}.", "structured_outputs.json") from None
    return _checked(schema, "structured_outputs.json")


def regex_literal(text: str) -> str:
    """A pattern matching exactly `text`: each regex metacharacter escaped, nothing else (the
    grammar compiler reads ECMA-262 patterns, which refuse escapes of ordinary characters)."""
    return "".join("\\" + c if c in REGEX_META else c for c in text)


def _checked(schema, param: str) -> OutputFormat:
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise bad_request(f"{param} must be a JSON Schema object.", param)
    try:
        check_is_schema(schema, param)
    except InvalidSchema as e:
        raise invalid_schema(e) from None
    try:
        check_schema(schema, param)
    except UnsupportedSchema as e:
        raise unsupported_schema(e, param) from None
    return OutputFormat(schema, param)


def invalid_schema(e: InvalidSchema) -> ApiError:
    return bad_request(f"The schema is not a valid JSON Schema: {e}.", e.path, "invalid_schema")


def unsupported_schema(e: UnsupportedSchema, param: str) -> ApiError:
    return bad_request(f"The schema cannot be enforced for constrained decoding: {e}.", param, "unsupported_schema")


def check_constrained_options(params) -> None:
    """NOTE: a grammar ends with EOS; tokens forced past it (ignore_eos, min_tokens) would
    break it, so a constrained request refuses them."""
    for name, value in (("ignore_eos", params.ignore_eos), ("min_tokens", params.min_tokens)):
        if value:
            raise unsupported(
                name,
                f"{name} cannot be combined with constrained decoding (response_format json, "
                "structured_outputs, tool_choice required/named, strict tools).",
            )
