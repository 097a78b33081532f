"""Which chat requests decode under a tool-call grammar.

tool_choice "required", a named function, or "auto" with a `strict: true` tool compiles
the declared tools into a grammar (api/structured/build.py). response_format json_object /
json_schema is the other kind of constrained chat request (api/structured/output_format.py).
"""

from __future__ import annotations


def needs_constraint(tools: list[dict], tool_choice) -> bool:
    if not tools or tool_choice == "none":
        return False
    if tool_choice in (None, "auto"):  # OpenAI's default with tools is "auto"
        return any(t["function"].get("strict") is True for t in tools)
    return True  # "required" or {"type": "function", ...}
