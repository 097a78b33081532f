"""GET /openapi.json: an OpenAPI 3.1 document built from the structs the server decodes
requests with and answers with (msgspec.json.schema_components): one source of truth.
Their fields carry the bounds the decoder enforces (api/schemas.py), and the rules across
fields a JSON Schema can state (a struct's SCHEMA_RULES); token ids are bounded by the
served vocabulary, output lengths and prompt id lists by the served context.

Hand-written here: ROUTES (which struct each route takes and returns) and BEYOND_SCHEMA,
the rules a JSON Schema cannot state (across fields, or needing the tokenizer or the
context length): a body the document calls valid is refused only by one of them, and its
400 names a parameter that the rule's pattern matches (the fuzz test holds us to that).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from dspark_loop.api import responses as r
from dspark_loop.api.auth import needs_key
from dspark_loop.api.chat.schemas import ChatCompletionRequest
from dspark_loop.api.schemas import (
    OUTPUT_LEN,
    PROMPT_IDS,
    TOKEN_ID,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from dspark_loop.api.server_info import ROUTER_ROUTES

REF = "#/components/schemas/{name}"
ERRORS = {
    400: "the request is invalid (the error names the parameter)",
    401: "a missing or wrong API key (when the server has keys)",
    404: "an unknown model or route",
    413: "the body is too large",
    500: "the engine failed this request",
    503: "not ready, overloaded (Retry-After), shutting down, or dead",
}
JSON = "application/json"
_MESSAGE = r"messages\[\d+\]"
_CONTEXT = "a prompt of max_model_len tokens or more (after tokenization)"
_SCHEMAS = (
    "a JSON Schema its draft's meta-schema refuses, or one constrained decoding cannot enforce or compile; "
    "structured_outputs.json text that is not JSON"
)
_GENERATION_RULES = [
    (r"(response_format\.json_schema\.schema|structured_outputs\.json)([.\[].*)?", _SCHEMAS),
    ("ignore_eos|min_tokens", "ignore_eos or min_tokens with constrained decoding"),
    ("max_tokens", "max_tokens and max_completion_tokens differ"),
    ("max_tokens|max_completion_tokens", "the prompt's tokens plus max_tokens beyond max_model_len"),
    ("min_tokens", "min_tokens above max_tokens"),
    ("best_of", "best_of other than n"),
    ("n|prompt", "more choices (prompts x n) than the server queues at once (--max-queued-requests)"),
]
# NOTE: JSON Schema cannot tell 1 from 1.0 (one number); the decoder reads an integer field
# only as written without a fraction or exponent. (message regex, rule), for every route.
INTEGER_SPELLING = (r"Invalid type for `\w+`: Expected `int[^`]*`, got `float`\.", "an integer written as 1.0 or 1e2")
# path -> [(a regex the 400's `param` matches in full, the rule)]
BEYOND_SCHEMA = {
    "/v1/completions": [
        ("prompt", _CONTEXT),
        ("prompt", "more than 1024 choices (prompts x n)"),
        *_GENERATION_RULES,
    ],
    "/v1/chat/completions": [
        ("messages", _CONTEXT.replace("a prompt", "a rendered conversation")),
        (rf"{_MESSAGE}\.role", "a last message not from the user or a tool"),
        (rf"{_MESSAGE}\.tool_call_id", "a tool result that answers no call of the assistant message before it"),
        (
            rf"{_MESSAGE}\.tool_calls(\[\d+\](\.id|\.function\.arguments)?)?",
            "tool_calls outside assistant "
            "messages; a tool call id used twice; arguments not a JSON object, or not writable in the chat format",
        ),
        (
            rf"({_MESSAGE}\.(content|reasoning_content|reasoning|tools)|({_MESSAGE}\.)?tools\[\d+\]\.function(\.name)?)",
            "text holding a control marker or special token of the chat format; a tool declared twice",
        ),
        ("tool_choice", "tool_choice other than none without tools, or naming an undeclared tool"),
        (
            rf"({_MESSAGE}\.)?tools\[\d+\]\.function\.parameters.*|tools",
            "tool parameters that are not a valid JSON Schema, or that a required or named call cannot enforce",
        ),
        *_GENERATION_RULES,
    ],
    "/tokenize": [],
    "/detokenize": [],
}

# (method, path, summary, request struct or None, 200 answer: struct | media type | None,
#  stream chunk struct or None, error statuses)
ROUTES = [
    (
        "post",
        "/v1/completions",
        "Text completion (stream=true: server-sent events)",
        CompletionRequest,
        r.CompletionResponse,
        r.CompletionChunk,
        (400, 401, 404, 413, 500, 503),
    ),
    (
        "post",
        "/v1/chat/completions",
        "Chat completion in the DeepSeek-V4 chat format",
        ChatCompletionRequest,
        r.ChatCompletionResponse,
        r.ChatCompletionChunk,
        (400, 401, 404, 413, 500, 503),
    ),
    ("get", "/v1/models", "The served model (503 while starting)", None, r.ModelList, None, (401, 503)),
    ("get", "/v1/models/{model}", "The served model's card by its id", None, r.ModelCard, None, (401, 404, 503)),
    ("post", "/tokenize", "Prompt text to token ids", TokenizeRequest, r.TokenizeResponse, None, (400, 401, 404, 413)),
    ("post", "/detokenize", "Token ids to text", DetokenizeRequest, r.DetokenizeResponse, None, (400, 401, 404, 413)),
    ("get", "/health", "200 when serving; 503 while starting, draining or dead", None, r.HealthResponse, None, ()),
    ("get", "/metrics", "Prometheus text exposition (vLLM's names)", None, "text/plain", None, ()),
    ("get", "/metrics/json", "The same figures as JSON", None, JSON, None, ()),
    ("get", "/openapi.json", "This document", None, JSON, None, ()),
    *ROUTER_ROUTES,
]


def _structs(info, seen: dict) -> None:
    """Every Struct type reachable from a msgspec.inspect type, by name."""
    if isinstance(info, msgspec.inspect.StructType):
        if info.cls.__name__ in seen:
            return
        seen[info.cls.__name__] = info
        for f in info.fields:
            _structs(f.type, seen)
        return
    for name in ("types", "item_type", "key_type", "value_type"):
        sub = getattr(info, name, None)
        for t in sub if isinstance(sub, tuple) else (sub,):
            if isinstance(t, msgspec.inspect.Type):
                _structs(t, seen)


def _content(answer) -> dict:
    if isinstance(answer, str):
        return {answer: {"schema": {"type": "string"} if answer != JSON else {"type": "object"}}}
    return {JSON: {"schema": {"$ref": REF.format(name=answer.__name__)}}}


def sse_event_schema(chunk: type) -> dict:
    """One server-sent event (OpenAPI < 3.2: `schema` describes each event): its data is
    a chunk or an error body as JSON, or the final [DONE]."""
    payload = {"anyOf": [{"$ref": REF.format(name=chunk.__name__)}, {"$ref": REF.format(name="ErrorResponse")}]}
    data = {"anyOf": [{"const": "[DONE]"}, {"type": "string", "contentMediaType": JSON, "contentSchema": payload}]}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": data},
        "description": f"`data: <{chunk.__name__}>` events, then `data: [DONE]`",
    }


def _bound_token_ids(schema, vocab_size: int | None, max_model_len: int | None = None) -> None:
    """Every token-id schema (title TokenId) gets the served vocabulary's top id; every
    output length and prompt id list the context's room (one token at least is the other's)."""
    if isinstance(schema, dict):
        title = schema.get("title")
        if title == TOKEN_ID and vocab_size is not None:
            schema["maximum"] = vocab_size - 1
        if title == OUTPUT_LEN and max_model_len is not None:
            schema["maximum"] = max_model_len - 1
        if title == PROMPT_IDS and max_model_len is not None:
            schema["maxItems"] = max_model_len - 1
        for value in schema.values():
            _bound_token_ids(value, vocab_size, max_model_len)
    elif isinstance(schema, list):
        for value in schema:
            _bound_token_ids(value, vocab_size, max_model_len)


def _bad_request(path: str) -> str:
    rules = BEYOND_SCHEMA.get(path)
    if not rules:
        return ERRORS[400]
    return ERRORS[400] + "; besides the schema, also for: " + "; ".join(rule for _, rule in rules)


def openapi_document(
    model_name: str,
    api_keys: bool = False,
    served=None,
    vocab_size: int | None = None,
    protect_router_info: bool = False,
    max_model_len: int | None = None,
) -> dict:
    """served: the (method, path) pairs the app answers (None: all of ROUTES).
    vocab_size: bounds every token id (None: ids are bounded below only); max_model_len:
    every output length and prompt id list (None: unbounded above)."""
    routes = [rt for rt in ROUTES if served is None or (rt[0], rt[1]) in served]
    structs = [s for route in routes for s in (route[3], route[4], route[5]) if isinstance(s, type)] + [r.ErrorResponse]
    _, components = msgspec.json.schema_components(structs, ref_template=REF)
    seen: dict = {}
    for info in msgspec.inspect.multi_type_info(structs):
        _structs(info, seen)
    for name, info in seen.items():
        if info.forbid_unknown_fields:  # the decoder refuses unknown fields: say so
            components[name]["additionalProperties"] = False
        components[name].update(getattr(info.cls, "SCHEMA_RULES", {}))
    _bound_token_ids(components, vocab_size, max_model_len)
    error = {"description": "", "content": {JSON: {"schema": {"$ref": REF.format(name="ErrorResponse")}}}}
    paths: dict = {}
    for method, path, summary, request, answer, chunk, statuses in routes:
        ok: dict[str, Any] = {"description": "OK", "content": _content(answer)}
        if chunk is not None:
            ok["content"]["text/event-stream"] = {"schema": sse_event_schema(chunk)}
        op: dict[str, Any] = {
            "summary": summary,
            "operationId": f"{method}_{re.sub(r'[^A-Za-z0-9]+', '_', path.strip('/'))}",
            "responses": {"200": ok},
        }
        if "{model}" in path:
            op["parameters"] = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
        for status in statuses:
            op["responses"][str(status)] = {**error, "description": ERRORS[status]}
        if 400 in statuses:
            op["responses"]["400"]["description"] = _bad_request(path)
        if path == "/health":
            op["responses"]["503"] = {"description": "not serving", "content": _content(r.HealthResponse)}
        if request is not None:
            op["requestBody"] = {
                "required": True,
                "content": {JSON: {"schema": {"$ref": REF.format(name=request.__name__)}}},
            }
        if api_keys and needs_key(path, protect_router_info):
            op["security"] = [{"bearer": []}]
        paths.setdefault(path, {})[method] = op
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "dspark_loop",
            "version": "1",
            "description": f"OpenAI-compatible serving of {model_name}. Integer fields take JSON integers: "
            f"{INTEGER_SPELLING[1]} is refused.",
        },
        "paths": paths,
        "components": {"schemas": components},
    }
    if api_keys:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
