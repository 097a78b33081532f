"""The schemathesis check that holds the document to its word: a body the document calls
valid may be refused (400) only by a rule it lists beyond the schema (openapi.BEYOND_SCHEMA,
openapi.INTEGER_SPELLING). It replaces schemathesis' positive_data_acceptance, which
allows no 400 at all; every other check runs as shipped.

Also a schemathesis hooks module: SCHEMATHESIS_HOOKS=tests.e2e.openapi_checks registers
the check for `schemathesis run`.
"""

from __future__ import annotations

import json
import re

import schemathesis

from dspark_loop.api.openapi import BEYOND_SCHEMA, INTEGER_SPELLING


def refusal_is_declared(path: str, status: int, body: bytes | str) -> bool:
    """Whether a 400 for a schema-valid body names a rule the document lists beyond it."""
    if status != 400:
        return status not in (422,)
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    if error.get("code") == "invalid_type" and re.fullmatch(INTEGER_SPELLING[0], error.get("message") or ""):
        return True
    param = error.get("param") or ""
    return any(re.fullmatch(pattern, param) for pattern, _ in BEYOND_SCHEMA.get(path, []))


@schemathesis.check
def accepted_unless_beyond_schema(ctx, response, case) -> bool | None:
    """positive_data_acceptance, less the refusals the document declares."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400:
        return None
    if case.operation.path not in BEYOND_SCHEMA:
        return None
    if not refusal_is_declared(case.operation.path, response.status_code, response.content):
        raise AssertionError(
            f"{case.operation.label}: a body the document calls valid was refused by a rule it does not "
            f"declare: {response.status_code} {response.content[:300]!r}"
        )
    return None
