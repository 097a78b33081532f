"""check_is_schema: a user's JSON Schema against its draft's meta-schema, the fault named by
keyword and JSON path."""

from __future__ import annotations

import pytest

from dspark_loop.api.structured.schema_validity import InvalidSchema, check_is_schema

DRAFT7 = "http://json-schema.org/draft-07/schema#"
BAD = [
    ({"type": "object", "properties": 5}, "f.properties", "properties", "draft 2020-12"),
    ({"properties": {"a": 5}}, "f.properties.a", "properties", "draft 2020-12"),
    ({"properties": {"type": {"type": "frob"}}}, "f.properties.type.type", "type", "draft 2020-12"),
    ({"anyOf": [{"type": "string"}, {"minLength": -1}]}, "f.anyOf[1].minLength", "minLength", "draft 2020-12"),
    ({"$schema": [1]}, "f.$schema", "$schema", "draft 2020-12"),
    ({"$schema": DRAFT7, "items": [5]}, "f.items", "items", "draft 7"),
    ({"$schema": DRAFT7.replace("http:", "https:"), "required": "a"}, "f.required", "required", "draft 7"),
]


@pytest.mark.parametrize("schema,path,keyword,draft", BAD, ids=[p for _, p, _, _ in BAD])
def test_a_schema_its_meta_schema_refuses_is_named_by_path_and_keyword(schema, path, keyword, draft):
    """The error must carry the JSON path from the request's field and the keyword at fault,
    judged by the draft `$schema` names (2020-12 without one)."""
    with pytest.raises(InvalidSchema) as e:
        check_is_schema(schema, "f")
    assert (e.value.path, e.value.keyword) == (path, keyword)
    assert f"keyword {keyword!r}" in str(e.value) and draft in str(e.value)


@pytest.mark.parametrize(
    "schema",
    [
        True,
        {},
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<year>\\d{4})"}}},
        {"$schema": DRAFT7, "items": [{"type": "string"}], "definitions": {"x": {}}},
        {"$schema": "https://example.com/my-draft", "type": "string"},
    ],
)
def test_valid_schemas_pass_whatever_their_draft_or_pattern_dialect(schema):
    """Valid schemas must pass: draft 7's list items, an ECMA-262 pattern Python's re cannot
    read (the compiler judges patterns), an unknown $schema (judged as 2020-12)."""
    check_is_schema(schema, "f")


def test_a_schema_nested_deeper_than_can_be_walked_is_refused_not_crashed():
    """A schema too deep to walk must be an InvalidSchema, not a RecursionError."""
    schema: dict = {}
    inner = schema
    for _ in range(5000):
        inner["items"] = {}
        inner = inner["items"]
    with pytest.raises(InvalidSchema, match="nested too deeply"):
        check_is_schema(schema, "f")
