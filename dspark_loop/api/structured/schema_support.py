"""Which JSON Schema keywords constrained decoding enforces, and a 400 for the rest.

xgrammar compiles JSON Schema into a grammar, but it skips some keywords silently (measured
on xgrammar 0.2.9: each keyword below let a violating document through). A schema that uses
one of them would be "accepted" and then not honoured, so it is refused up front, naming the
keyword and where it sits. Everything else (type, properties, required, items, prefixItems,
enum, const, anyOf, oneOf, $ref/$defs, minLength/maxLength, pattern, the formats below,
minimum/maximum and their exclusive forms, minItems/maxItems, min/maxProperties,
additionalProperties, patternProperties, propertyNames) is enforced by the grammar.

    check_schema(schema, "response_format.json_schema.schema")  # raises UnsupportedSchema

It walks schemas the meta-schema has passed (schema_validity.py), and skips any value of a
shape it does not expect (a keyword of another draft) rather than trusting it.
"""

from __future__ import annotations

# NOTE: formats xgrammar turns into a grammar; any other format (idn-email, iri, regex,
# int32...) would be left unchecked.
ENFORCED_FORMATS = frozenset(
    {
        "email",
        "uri",
        "uri-reference",
        "uri-template",
        "date",
        "time",
        "date-time",
        "duration",
        "uuid",
        "hostname",
        "ipv4",
        "ipv6",
        "json-pointer",
        "relative-json-pointer",
    }
)
NEVER_ENFORCED: tuple[str, ...] = ("not", "if", "then", "else", "contains", "minContains", "maxContains")
NEVER_ENFORCED += ("dependentRequired", "dependentSchemas", "dependencies")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_VALUES = ("additionalProperties", "items", "propertyNames", "unevaluatedProperties", "unevaluatedItems")


class UnsupportedSchema(ValueError):
    def __init__(self, where: str, keyword: str, why: str):
        super().__init__(f"{where}: JSON Schema keyword {keyword!r} {why}")
        self.keyword = keyword


def check_schema(schema, where: str) -> None:
    """Raise UnsupportedSchema for the first keyword the grammar would not enforce."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise UnsupportedSchema(where, "type", "must be given by a schema object")
    for key in NEVER_ENFORCED:
        if key in schema:
            raise UnsupportedSchema(where, key, "cannot be enforced by constrained decoding")
    if schema.get("uniqueItems") is True:
        raise UnsupportedSchema(where, "uniqueItems", "cannot be enforced by constrained decoding")
    if "multipleOf" in schema:
        integral = schema.get("type") == "integer" and isinstance(schema["multipleOf"], int)
        if not integral:
            raise UnsupportedSchema(where, "multipleOf", "is enforced only on integers, by an integer")
    fmt = schema.get("format")
    if "format" in schema and (not isinstance(fmt, str) or fmt not in ENFORCED_FORMATS):
        known = ", ".join(sorted(ENFORCED_FORMATS))
        raise UnsupportedSchema(where, "format", f"{schema['format']!r} cannot be enforced (enforced: {known})")
    if ("pattern" in schema or "format" in schema) and ("minLength" in schema or "maxLength" in schema):
        length = "minLength" if "minLength" in schema else "maxLength"
        raise UnsupportedSchema(where, length, "cannot be enforced together with pattern or format")
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        raise UnsupportedSchema(where, "allOf", "with more than one schema cannot be enforced")
    for key in SCHEMA_MAPS:
        subs = schema.get(key)
        for name, sub in subs.items() if isinstance(subs, dict) else ():
            check_schema(sub, f"{where}.{key}.{name}")
    for key in SCHEMA_LISTS:
        subs = schema.get(key)
        for i, sub in enumerate(subs if isinstance(subs, list) else ()):
            check_schema(sub, f"{where}.{key}[{i}]")
    for key in SCHEMA_VALUES:
        if key in schema:
            sub = schema[key]
            subs = sub if isinstance(sub, list) else [sub]
            for i, s in enumerate(subs):
                check_schema(s, f"{where}.{key}" + (f"[{i}]" if isinstance(sub, list) else ""))
