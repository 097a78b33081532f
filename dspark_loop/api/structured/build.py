"""Building a request's GrammarConstraint: a JSON schema (response_format, structured_outputs)
or the DSML tool-call tag, compiled once per canonical key (compiler.compile_cached).

xgrammar (and through it torch) is the optional `tools` extra: it is imported here, lazily,
only when a constrained request arrives, never at server start-up; without it the request is
a 400 saying what to install. Slow the first time (the vocab is compiled once per
tokenizer): call these off the event loop.
"""

from __future__ import annotations

import importlib
import json
import logging

from dspark_loop.api.errors import ApiError, bad_request

log = logging.getLogger(__name__)

MISSING_XGRAMMAR = (
    "constrained decoding (response_format json_object/json_schema, structured_outputs, "
    "tool_choice required/named, strict tools) needs the optional xgrammar package: "
    "pip install dspark-loop[tools]"
)


def _xgrammar(param: str):
    try:
        compiler = importlib.import_module("dspark_loop.api.structured.compiler")
        grammar_constraint = importlib.import_module("dspark_loop.api.structured.grammar_constraint")
    except ImportError as e:
        raise ApiError(400, f"{MISSING_XGRAMMAR} ({e})", param=param, code="unsupported_parameter") from None
    return compiler, grammar_constraint


def _special(tokenizer, text: str) -> int | None:
    return tokenizer.token_to_id(text)


def format_constraint(tokenizer, fmt, *, start_in_reasoning: bool, vocab_size: int):
    """A GrammarConstraint for an OutputFormat (ApiError 400 naming fmt.param when it fails)."""
    from dspark_loop.api.chat.render import EOS, THINK_END

    compiler, gc = _xgrammar(fmt.param)
    key: tuple  # the compiled grammar's cache key
    if fmt.regex is not None:
        what, key = "pattern", ("regex", fmt.regex)

        def build(c):
            return c.compile_regex(fmt.regex)

    else:
        what, key = "schema", ("json_schema", compiler.canonical(fmt.schema), fmt.strict_mode)

        def build(c):
            return c.compile_json_schema(json.dumps(fmt.schema), any_whitespace=False, strict_mode=fmt.strict_mode)

    try:
        compiled = compiler.compile_cached(tokenizer, vocab_size, key, build)
    except (ValueError, RuntimeError) as e:  # xgrammar refused the schema or pattern
        raise bad_request(
            f"The {what} cannot be compiled for constrained decoding: {_first_line(e)}.", fmt.param, f"invalid_{what}"
        ) from None
    eos = _special(tokenizer, EOS)
    # NOTE: no EOS while reasoning: the document comes after </think>, and must come.
    return gc.GrammarConstraint(
        compiled,
        vocab_size,
        eos_id=eos,
        think_end_id=_special(tokenizer, THINK_END) if start_in_reasoning else None,
        reasoning_refused=(eos,),
        encode=_encoder(tokenizer),
    )


def tool_constraint(
    tokenizer, tools: list[dict], tool_choice, *, start_in_reasoning: bool, vocab_size: int, parallel_tool_calls: bool
):
    """A GrammarConstraint for the tool-call block (ApiError 400 naming `tools`)."""
    from dspark_loop.api.chat.render import DSML, EOS, THINK_END

    compiler, gc = _xgrammar("tool_choice")
    from dspark_loop.api.chat.tool_grammar import tool_call_tag
    from dspark_loop.api.structured.schema_support import UnsupportedSchema

    choice = "auto" if tool_choice is None else tool_choice
    try:
        tag = tool_call_tag(tools, choice, parallel_tool_calls=parallel_tool_calls)
        key = ("tools", compiler.canonical(tag.model_dump(mode="json")))
        compiled = compiler.compile_cached(tokenizer, vocab_size, key, lambda c: c.compile_structural_tag(tag))
    except UnsupportedSchema as e:
        raise bad_request(
            f"The tool schemas cannot be enforced for constrained decoding: {e}.", "tools", "unsupported_tool_schema"
        ) from None
    except (ValueError, RuntimeError) as e:  # xgrammar refused the grammar we built
        log.warning("tool grammar did not compile: %s", e)
        raise bad_request(
            f"The tool schemas cannot be compiled into a grammar: {_first_line(e)}.", "tools", "unsupported_tool_schema"
        ) from None
    eos = _special(tokenizer, EOS)
    # Tokens refused while reasoning: no block inside it, no end before a required call.
    refused = (_special(tokenizer, DSML),) + ((eos,) if choice != "auto" else ())
    return gc.GrammarConstraint(
        compiled,
        vocab_size,
        eos_id=eos,
        think_end_id=_special(tokenizer, THINK_END) if start_in_reasoning else None,
        reasoning_refused=tuple(t for t in refused if t is not None),
        encode=_encoder(tokenizer),
    )


def _encoder(tokenizer):
    """text -> ids, as the drafts of a string the grammar forces (jump-forward)."""
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def _first_line(e: Exception) -> str:
    """xgrammar's message without its source location prefix."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text
