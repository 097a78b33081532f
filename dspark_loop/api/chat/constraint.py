"""Which chat requests decode under a tool-call grammar, and building that constraint.

tool_choice "required", a named function, or "auto" with a `strict: true` tool compiles
the declared tools into a ToolConstraint (xgrammar). xgrammar (and through it torch) is an
optional extra: it is imported here, lazily, only when such a request arrives, never at
server start-up. A schema the grammar cannot honour is a 400 before anything streams.
"""

from __future__ import annotations

import logging

from dspark_loop.api.errors import ApiError, bad_request
from dspark_loop.engine.outputs import TokenConstraint

log = logging.getLogger(__name__)

MISSING_XGRAMMAR = (
    "constrained tool calls (tool_choice required/named, strict tools) need "
    "the optional xgrammar package: pip install dspark-loop[tools]"
)


def needs_constraint(tools: list[dict], tool_choice) -> bool:
    if not tools or tool_choice == "none":
        return False
    if tool_choice in (None, "auto"):  # OpenAI's default with tools is "auto"
        return any(t["function"].get("strict") is True for t in tools)
    return True  # "required" or {"type": "function", ...}


def build_constraint(
    tokenizer, tools: list[dict], tool_choice, *, start_in_reasoning: bool, vocab_size: int, parallel_tool_calls: bool
) -> TokenConstraint:
    """A ToolConstraint, or ApiError(400) when it cannot be had. Slow the first time (the
    vocab is compiled once per tokenizer): call it off the event loop."""
    try:
        from dspark_loop.api.chat.tool_constraint import ToolConstraint
    except ImportError as e:
        raise ApiError(400, f"{MISSING_XGRAMMAR} ({e})", param="tool_choice", code="unsupported_parameter") from None
    from dspark_loop.api.chat.tool_grammar import UnsupportedToolSchema

    choice = "auto" if tool_choice is None else tool_choice
    try:
        return ToolConstraint.build(
            tokenizer,
            tools,
            choice,
            start_in_reasoning=start_in_reasoning,
            vocab_size=vocab_size,
            parallel_tool_calls=parallel_tool_calls,
        )
    except UnsupportedToolSchema as e:
        raise bad_request(
            f"The tool schemas cannot be enforced for constrained decoding: {e}.", "tools", "unsupported_tool_schema"
        ) from None
    except (ValueError, RuntimeError) as e:  # xgrammar refused the grammar we built
        log.warning("tool grammar did not compile: %s", e)
        raise bad_request(
            f"The tool schemas cannot be compiled into a grammar: {e}.", "tools", "unsupported_tool_schema"
        ) from None
