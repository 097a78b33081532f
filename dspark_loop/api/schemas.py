"""Request bodies as msgspec Structs, decoded strictly: a wrong type, an unknown field or a
value out of its field's bounds is a 400 naming the field (as vLLM's strict mode), never a
silent default.

NOTE: the bounds live here, as msgspec.Meta on the fields: the decoder enforces them and
GET /openapi.json publishes them (api/openapi.py), so the document cannot drift from what
is accepted. Rules a JSON Schema cannot state (across fields, or needing the tokenizer)
stay in the handlers and are listed in openapi.BEYOND_SCHEMA.

Sampling fields take vLLM's names, defaults and ranges (api/generation/sampling_ranges.py).
Still refused when set (a 400 saying so): logit_bias, suffix, best_of != n. Ignored: user.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

import msgspec

from dspark_loop.api.bounds import bound_error
from dspark_loop.api.errors import ApiError
from dspark_loop.api.limits import MAX_LOGPROBS, MAX_N, MAX_STOP_STRINGS, SEED_RANGE

TOKEN_ID = "TokenId"  # the schema title openapi.py bounds by the served vocabulary
OUTPUT_LEN = "OutputLength"  # ... and these by the served context (max_model_len - 1)
PROMPT_IDS = "PromptTokenIds"
TokenId = Annotated[int, msgspec.Meta(ge=0, title=TOKEN_ID)]
OutputLen = Annotated[int, msgspec.Meta(ge=1, title=OUTPUT_LEN)]
AtLeastOne = Annotated[int, msgspec.Meta(ge=1)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
# NOTE: an int bound past int64 is beyond msgspec's Meta: the seed's top is published here
# and enforced by sampling_ranges.sampling_fields.
Seed = Annotated[int, msgspec.Meta(ge=SEED_RANGE[0], extra_json_schema={"maximum": SEED_RANGE[1] - 1})]
NumLogprobs = Annotated[int, msgspec.Meta(ge=0, le=MAX_LOGPROBS)]
Refused = Annotated[str, msgspec.Meta(max_length=0)]  # any non-empty value is unsupported

RESPONSE_FORMAT_DOC = (
    'OpenAI\'s output format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
    '"json_schema": {"name", "schema", "strict"}} (decoding is constrained by the schema)'
)
STRUCTURED_OUTPUTS_DOC = (
    'vLLM\'s structured outputs: {"json": schema}, {"json_object": true}, {"regex": pattern} or {"choice": [strings]}'
)
# NOTE: what output_format.py takes, stated whole: decoded as Any (msgspec would publish its
# own object-or-null for a dict) and checked there; that a schema is a valid JSON Schema the
# grammar can enforce is checked beyond these (openapi.BEYOND_SCHEMA)
_SCHEMA_VALUE = {"anyOf": [{"type": "object"}, {"const": True}]}
_JSON_SCHEMA_SPEC = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
        "schema": _SCHEMA_VALUE,
        "strict": {"type": ["boolean", "null"]},
    },
}
_OFF = {"enum": [None, False]}  # a structured_outputs kind not asked for
RESPONSE_FORMAT_SCHEMA = {
    "anyOf": [
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
        {
            "type": "object",
            "required": ["type", "json_schema"],
            "properties": {"type": {"const": "json_schema"}, "json_schema": _JSON_SCHEMA_SPEC},
        },
        {"type": "null"},
    ]
}
STRUCTURED_OUTPUTS_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "required": ["json"],
            "properties": {"json": {"anyOf": [*_SCHEMA_VALUE["anyOf"], {"type": "string"}]}, "json_object": _OFF},
            "additionalProperties": _OFF,
        },
        {
            "type": "object",
            "required": ["json_object"],
            "properties": {"json_object": {"const": True}, "json": _OFF},
            "additionalProperties": _OFF,
        },
        {
            "type": "object",
            "required": ["regex"],
            "properties": {"regex": {"type": "string", "minLength": 1}},
            "additionalProperties": _OFF,
        },
        {
            "type": "object",
            "required": ["choice"],
            "properties": {"choice": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}},
            "additionalProperties": _OFF,
        },
        {"type": "null"},
    ]
}
ResponseFormat = Annotated[Any, msgspec.Meta(description=RESPONSE_FORMAT_DOC, extra_json_schema=RESPONSE_FORMAT_SCHEMA)]
StructuredOutputs = Annotated[
    Any, msgspec.Meta(description=STRUCTURED_OUTPUTS_DOC, extra_json_schema=STRUCTURED_OUTPUTS_SCHEMA)
]


class Strict(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    # rules across fields that the document states beside the fields' own schemas
    SCHEMA_RULES: ClassVar[dict] = {}


class StreamOptions(Strict):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class SpeculationOptions(Strict):
    """`"speculation": {...}` (extra_body): this request's DSpark speculation."""

    max_draft_tokens: int | None = None  # at most this many drafts verified per step; 0: off
    return_stats: bool | None = None  # answer with "speculation": {proposed, accepted, verify_steps}


class GenerationFields(Strict):
    """The generation fields /v1/completions and /v1/chat/completions share, with one
    meaning and one validation (sampling.py). A new generation knob goes here."""

    model: str | None = None
    max_tokens: OutputLen | None = None  # prompt + max_tokens <= max_model_len (sampling.py)
    max_completion_tokens: OutputLen | None = None
    min_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    stop: NonEmpty | Annotated[list[NonEmpty], msgspec.Meta(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None  # false: special tokens appear in the text (as vLLM)
    seed: Seed | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None  # client metadata, ignored
    # sampling (api/generation/sampling_ranges.py)
    temperature: Annotated[float, msgspec.Meta(ge=0.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-1)] | None = None  # -1 and 0: off
    min_p: Fraction | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_N)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0.0)] | None = None
    logit_bias: Annotated[dict[str, float], msgspec.Meta(max_length=0)] | None = None  # refused
    speculation: SpeculationOptions | None = None  # DSpark (K=7) per-request control


TEXT_PROMPT = {"type": "string", "minLength": 1}
IDS_PROMPT = {
    "title": PROMPT_IDS,
    "type": "array",
    "minItems": 1,
    "items": {"title": TOKEN_ID, "type": "integer", "minimum": 0},
}
# NOTE: msgspec types no union of several array types, so `prompt` is decoded as Any
# (prompt.py checks it) and its schema is written here, beside it.
PROMPT_SCHEMA = {
    "anyOf": [
        TEXT_PROMPT,
        IDS_PROMPT,
        {"type": "array", "minItems": 1, "items": TEXT_PROMPT},
        {"type": "array", "minItems": 1, "items": IDS_PROMPT},
    ],
    "description": "a text, token ids, or a batch of texts or of token-id lists",
}


class CompletionRequest(GenerationFields, kw_only=True):
    prompt: Annotated[Any, msgspec.Meta(extra_json_schema=PROMPT_SCHEMA)]  # checked in prompt.py
    echo: bool | None = None
    return_token_ids: bool | None = None
    best_of: AtLeastOne | None = None  # only == n
    logprobs: NumLogprobs | None = None  # top entries per token; with echo: the prompt's too
    suffix: Refused | None = None
    response_format: ResponseFormat = None  # text | json_object | json_schema (api/structured/)
    structured_outputs: StructuredOutputs = None  # vLLM's: json | json_object | regex | choice


class TokenizeRequest(Strict):
    # exactly one of prompt and text (an alias), as a string
    SCHEMA_RULES: ClassVar[dict] = {
        "oneOf": [
            {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
            {"required": ["text"], "properties": {"text": {"type": "string"}}},
        ]
    }
    model: str | None = None
    prompt: str | None = None
    text: str | None = None  # alias of prompt
    add_special_tokens: bool = True
    return_token_strs: bool | None = None


class DetokenizeRequest(Strict, kw_only=True):
    tokens: list[TokenId]
    model: str | None = None


_PATH = re.compile(r" - at `\$\.([A-Za-z0-9_]+)[^`]*`$")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`(?: - at `\$\.([^`]+)`)?")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def decode_body(body: bytes, kind: type):
    """JSON bytes -> `kind`, or an ApiError(400) whose param names the offending field."""
    if not body.strip():
        raise ApiError(400, "The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as e:
        msg = str(e)
        if error := bound_error(kind, msg, body):
            raise error from None
        if m := _UNKNOWN.search(msg):
            param = f"{m.group(2)}.{m.group(1)}" if m.group(2) else m.group(1)  # nested: its whole path
            raise ApiError(
                400,
                f"Unknown parameter `{param}`: this server does not accept it.",
                param=param,
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
    except RecursionError:
        raise ApiError(400, "The request body is nested too deeply.", code="invalid_json") from None
