"""GET /openapi.json: an OpenAPI 3.1 document built from the structs the server decodes
requests with and answers with (msgspec.json.schema_components): one source of truth.

ROUTES below is the only hand-written part: which struct each route takes and returns.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dspark_loop.api import responses as r
from dspark_loop.api.auth import needs_key
from dspark_loop.api.chat.schemas import ChatCompletionRequest
from dspark_loop.api.schemas import CompletionRequest, DetokenizeRequest, TokenizeRequest
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
    ("get", "/v1/models", "The served model", None, r.ModelList, None, (401,)),
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


def openapi_document(model_name: str, api_keys: bool = False, served=None, protect_router_info: bool = False) -> dict:
    """served: the (method, path) pairs the app answers (None: all of ROUTES)."""
    routes = [rt for rt in ROUTES if served is None or (rt[0], rt[1]) in served]
    structs = [s for route in routes for s in (route[3], route[4], route[5]) if isinstance(s, type)] + [r.ErrorResponse]
    _, components = msgspec.json.schema_components(structs, ref_template=REF)
    seen: dict = {}
    for info in msgspec.inspect.multi_type_info(structs):
        _structs(info, seen)
    for name, info in seen.items():
        if info.forbid_unknown_fields:  # the decoder refuses unknown fields: say so
            components[name]["additionalProperties"] = False
    error = {"description": "", "content": {JSON: {"schema": {"$ref": REF.format(name="ErrorResponse")}}}}
    paths: dict = {}
    for method, path, summary, request, answer, chunk, statuses in routes:
        ok: dict[str, Any] = {"description": "OK", "content": _content(answer)}
        if chunk is not None:
            ok["content"]["text/event-stream"] = {"schema": sse_event_schema(chunk)}
        op: dict[str, Any] = {
            "summary": summary,
            "operationId": f"{method}_{path.strip('/').replace('/', '_').replace('.', '_')}",
            "responses": {"200": ok},
        }
        for status in statuses:
            op["responses"][str(status)] = {**error, "description": ERRORS[status]}
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
        "info": {"title": "dspark_loop", "version": "1", "description": f"OpenAI-compatible serving of {model_name}"},
        "paths": paths,
        "components": {"schemas": components},
    }
    if api_keys:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
