"""ChatCompletionRequest: the /v1/chat/completions body, decoded as strictly as completions'.

messages / tools / tool_choice stay plain JSON here: chat/validate.py checks them rule by
rule (a 400 naming the message and field). Their JSON Schemas below are what GET
/openapi.json publishes for them. NOTE: they state validate.py's rules that a JSON Schema
can (roles, required content, text parts, tool names); keep the two together: the fuzz
test (tests/e2e/test_openapi_fuzz.py) sends bodies both ways across every line of them.
The generation fields are completions' own (schemas.GenerationFields), so both routes
refuse the same values.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec

from dspark_loop.api.chat.render import EFFORT_ALIASES
from dspark_loop.api.chat.validate import ROLE_ALIASES, ROLES, TOOL_CHOICES, TOOL_NAME
from dspark_loop.api.schemas import GenerationFields, NumLogprobs, ResponseFormat, StructuredOutputs

_NAME = {"type": "string", "pattern": f"^{TOOL_NAME.pattern}$"}
_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}
_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": _NAME, "parameters": {"anyOf": [{"type": "object"}, {"type": "null"}]}},
        },
    },
}
TOOLS_SCHEMA = {"type": "array", "items": _TOOL}
_TOOL_CALL = {
    "type": "object",
    "required": ["id", "function"],
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {
                "name": _NAME,
                "arguments": {"anyOf": [{"type": "object"}, {"type": "string", "description": "a JSON object"}]},
            },
        },
    },
}


def _message(role: str) -> dict:
    content_required = role in ("user", "tool")  # validate.content_text(required=...)
    props: dict = {
        "role": {"const": role},
        "content": _CONTENT if content_required else {"anyOf": [_CONTENT, {"type": "null"}]},
    }
    if role == "system":
        props["tools"] = {"anyOf": [TOOLS_SCHEMA, {"type": "null"}]}
    if role == "assistant":
        props["tool_calls"] = {"anyOf": [{"type": "array", "items": _TOOL_CALL}, {"type": "null"}]}
    if role == "tool":
        props["tool_call_id"] = {"type": "string"}
    required = ["role", "content"] if content_required else ["role"]
    return {"type": "object", "required": required + (["tool_call_id"] if role == "tool" else []), "properties": props}


MESSAGES_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "items": {"anyOf": [_message(role) for role in (*ROLES, *ROLE_ALIASES)]},
}
TOOL_CHOICE_SCHEMA = {
    "anyOf": [
        {"enum": list(TOOL_CHOICES)},
        {
            "type": "object",
            "required": ["type", "function"],
            "properties": {"type": {"const": "function"}, "function": {"type": "object"}},
        },
        {"type": "null"},
    ]
}
_BOOL = {"type": "boolean"}


class ChatCompletionRequest(GenerationFields, kw_only=True):
    # top_logprobs above 0 needs logprobs: true (sampling_ranges.sampling_fields)
    SCHEMA_RULES: ClassVar[dict] = {
        "anyOf": [
            {"properties": {"top_logprobs": {"anyOf": [{"type": "null"}, {"maximum": 0}]}}},
            {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
        ]
    }
    messages: Annotated[Any, msgspec.Meta(extra_json_schema=MESSAGES_SCHEMA)]
    # tools and the chat format
    tools: Annotated[Any, msgspec.Meta(extra_json_schema={"anyOf": [TOOLS_SCHEMA, {"type": "null"}]})] = None
    tool_choice: Annotated[Any, msgspec.Meta(extra_json_schema=TOOL_CHOICE_SCHEMA)] = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: Annotated[str, msgspec.Meta(extra_json_schema={"enum": ["none", *EFFORT_ALIASES]})] | None = None
    chat_template_kwargs: (
        Annotated[
            dict[str, Any],
            msgspec.Meta(extra_json_schema={"properties": {"thinking": _BOOL, "enable_thinking": _BOOL}}),
        ]
        | None
    ) = None
    # DeepSeek's API: {"type": "enabled" | "disabled"}
    thinking: (
        Annotated[
            dict[str, Any],
            msgspec.Meta(
                extra_json_schema={"required": ["type"], "properties": {"type": {"enum": ["enabled", "disabled"]}}}
            ),
        ]
        | None
    ) = None
    response_format: ResponseFormat = None  # text | json_object | json_schema (api/structured/)
    structured_outputs: StructuredOutputs = None  # vLLM's: {"json": schema} | {"json_object": true}
    logprobs: bool | None = None
    top_logprobs: NumLogprobs | None = None
    # OpenAI's account-side fields, accepted and ignored as `user` is: nothing is stored, one tier
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None

    def format_fields(self) -> dict:
        """The fields validate.py / chat_options read, as the plain dict they expect."""
        body = {"messages": self.messages}
        for key in ("tools", "tool_choice", "reasoning_effort", "chat_template_kwargs", "thinking"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        return body
