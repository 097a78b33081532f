"""Request bodies as msgspec Structs, decoded strictly: a wrong type or an unknown field is
a 400 naming the field (as vLLM's strict mode), never a silent default.

Sampling fields take vLLM's names, defaults and ranges (api/sampling_ranges.py). Still
refused when set (a 400 saying so): logit_bias, suffix, best_of != n. Ignored: user.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

from dspark_loop.api.errors import ApiError

RESPONSE_FORMAT_DOC = (
    'OpenAI\'s output format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
    '"json_schema": {"name", "schema", "strict"}} (decoding is constrained by the schema)'
)
STRUCTURED_OUTPUTS_DOC = 'vLLM\'s structured outputs: {"json": schema} or {"json_object": true}'
ResponseFormat = Annotated[dict[str, Any] | None, msgspec.Meta(description=RESPONSE_FORMAT_DOC)]
StructuredOutputs = Annotated[dict[str, Any] | None, msgspec.Meta(description=STRUCTURED_OUTPUTS_DOC)]


class Strict(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


class StreamOptions(Strict):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class GenerationFields(Strict):
    """The generation fields /v1/completions and /v1/chat/completions share, with one
    meaning and one validation (sampling.py). A new generation knob goes here."""

    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    min_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None  # client metadata, ignored
    # sampling (api/sampling_ranges.py)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


class CompletionRequest(GenerationFields):
    prompt: Any = None  # str | list[int] | [str] | [list[int]]: checked in prompt.py
    echo: bool | None = None
    return_token_ids: bool | None = None
    best_of: int | None = None  # only == n
    logprobs: int | None = None  # top entries per token (0..20); with echo: the prompt's too
    suffix: str | None = None  # refused
    response_format: ResponseFormat = None  # text | json_object | json_schema (api/structured/)
    structured_outputs: StructuredOutputs = None  # vLLM's: {"json": schema} | {"json_object": true}


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    text: str | None = None  # alias of prompt
    add_special_tokens: bool = True
    return_token_strs: bool | None = None


class DetokenizeRequest(Strict):
    tokens: list[int]
    model: str | None = None


_PATH = re.compile(r" - at `\$\.([A-Za-z0-9_]+)[^`]*`$")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def decode_body(body: bytes, kind: type):
    """JSON bytes -> `kind`, or an ApiError(400) whose param names the offending field."""
    if not body.strip():
        raise ApiError(400, "The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as e:
        msg = str(e)
        if m := _UNKNOWN.search(msg):
            raise ApiError(
                400,
                f"Unknown parameter `{m.group(1)}`: this server does not accept it.",
                param=m.group(1),
                code="unknown_parameter",
            ) from None
        if m := _MISSING.search(msg):
            raise ApiError(
                400, f"Missing required parameter `{m.group(1)}`.", param=m.group(1), code="missing_required_parameter"
            ) from None
        if m := _PATH.search(msg):
            param = m.group(1)
            raise ApiError(
                400, f"Invalid type for `{param}`: {msg[: m.start()]}.", param=param, code="invalid_type"
            ) from None
        raise ApiError(400, f"Invalid request body: {msg}.", code="invalid_type") from None
    except msgspec.DecodeError as e:
        raise ApiError(400, f"The request body is not valid JSON: {e}.", code="invalid_json") from None
