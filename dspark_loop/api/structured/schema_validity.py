"""Whether a user's JSON Schema is a JSON Schema: its draft's meta-schema, checked by jsonschema
before any compiler or walker of ours reads it.

The draft is the schema's `$schema` (draft 3 to 2020-12), 2020-12 when it has none or names
one jsonschema does not know. A schema
the meta-schema refuses raises InvalidSchema, which names the keyword at fault and its JSON
path from the request's field:

    check_is_schema({"type": "object", "properties": 5}, "response_format.json_schema.schema")
    -> InvalidSchema: response_format.json_schema.schema.properties: 5 is not of type 'object'
       (keyword 'properties', JSON Schema draft 2020-12)
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.validators import validator_for

MAX_REMEMBERED = 1024  # distinct schemas whose verdict is kept (meta_problem)
# keywords whose value maps names to subschemas: the key after one of these is a name, not a keyword
NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})


class InvalidSchema(ValueError):
    def __init__(self, path: str, keyword: str, why: str):
        super().__init__(f"{path}: {why}")
        self.path = path  # the JSON path of the offending value, from the request's field
        self.keyword = keyword


def check_is_schema(schema, where: str) -> None:
    """Raise InvalidSchema unless `schema` is valid under its draft's meta-schema."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise InvalidSchema(where, "type", "a JSON Schema must be an object or a boolean")
    try:
        problem = meta_problem(json.dumps(schema, sort_keys=True))
    except RecursionError:
        problem = [], "$schema", "the schema is nested too deeply"
    if problem is not None:
        path, keyword, why = problem
        raise InvalidSchema(where + json_path(path), keyword, why)


@functools.lru_cache(maxsize=MAX_REMEMBERED)
def meta_problem(schema_text: str) -> tuple[list, str, str] | None:
    """(JSON path, keyword, why) of the first meta-schema violation of a schema object given
    as JSON text, else None. NOTE: remembered: the meta-schema walk takes milliseconds and
    a client resends the same tools every turn, on the event loop."""
    schema = json.loads(schema_text)
    validator = draft_validator(schema.get("$schema"))
    try:
        # NOTE: no format checks: "pattern" is an ECMA-262 regex, which Python's re (jsonschema's
        # "regex" format) misreads; the compiler judges patterns (its error is a 400 too)
        validator.check_schema(schema, format_checker=None)
    except SchemaError as e:
        path = list(e.absolute_path)
        keyword = keyword_at(path, str(e.validator))
        return path, keyword, f"{e.message} (keyword {keyword!r}, JSON Schema {draft_name(validator)})"
    except RecursionError:
        return [], "$schema", "the schema is nested too deeply"
    return None


def draft_validator(draft):
    """The validator class of the draft `$schema` names (https spellings of the http ids too);
    2020-12 for none or one this jsonschema does not know, whose meta-schema then judges the
    value of `$schema` itself (a string)."""
    if isinstance(draft, str):
        for uri in (draft, draft.replace("https://", "http://", 1)):
            try:
                found = validator_for({"$schema": uri}, default=None)
            except ValueError:  # not a URI
                found = None
            if found is not None:
                return found
    return Draft202012Validator


def json_path(path: Iterable) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def keyword_at(path: list, fallback: str) -> str:
    """The last keyword on the path (a property name under `properties` is not one);
    the meta-schema's own keyword when the fault is at the root."""
    keyword, after_map = None, False
    for p in path:
        if isinstance(p, int) or after_map:
            after_map = False
            continue
        keyword, after_map = p, p in NAME_MAPS
    return keyword or fallback


def draft_name(validator) -> str:
    """'draft 2020-12' from Draft202012Validator's meta-schema id."""
    uri = str(validator.META_SCHEMA.get("$schema", validator.META_SCHEMA.get("id", "")))
    for part in uri.split("/"):
        if part.startswith("draft-0"):
            return "draft " + part[len("draft-0") :].rstrip("#")
        if part[:4].isdigit():
            return f"draft {part}"
    return "draft 2020-12"
