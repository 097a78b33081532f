"""The /v1/chat/completions rules that answer 400 before anything is rendered.

validate_chat_request raises ChatRequestError(message, param) on the first broken rule, in
message order, and returns warnings (inputs the format ignores) for the handler to log.
"""

from __future__ import annotations

import json
import re

from dspark_loop.api.chat.render import (
    ASSISTANT,
    BOS,
    DSML,
    EFFORT_ALIASES,
    EOS,
    PARAMETER_END,
    THINK_END,
    THINK_START,
    TOOL_RESULT_END,
    USER,
)
from dspark_loop.api.structured.schema_validity import InvalidSchema, check_is_schema
from dspark_loop.config.server_config import THINKING_KEYS

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
PARAM_NAME = re.compile(r'[^"<>\n]+')
CONTROL_MARKERS = (BOS, EOS, USER, ASSISTANT, THINK_START, THINK_END, DSML)
SPECIAL_TOKEN = re.compile(r"<｜[^<>｜]{1,64}｜>")  # any DeepSeek special-token spelling
ROLES = ("system", "user", "assistant", "tool")
ROLE_ALIASES = {"developer": "system"}  # OpenAI's newer name for system instructions (o1 and later)


def with_role_aliases(messages):
    """messages with each aliased role (ROLE_ALIASES) under the role it names; anything else as given."""
    if not isinstance(messages, list):
        return messages
    return [
        {**m, "role": ROLE_ALIASES[m["role"]]}
        if isinstance(m, dict) and isinstance(m.get("role"), str) and m["role"] in ROLE_ALIASES
        else m
        for m in messages
    ]


TOOL_CHOICES = ("none", "auto", "required")


class ChatRequestError(ValueError):
    def __init__(self, message: str, param: str | None):
        super().__init__(message)
        self.message = message
        self.param = param


def check_text(text: str, param: str) -> None:
    """Reject control markers in user-supplied text: they would tokenise to control tokens."""
    # NOTE: prompts are tokenised with special tokens enabled, so a literal "</think>" or
    # "<｜User｜>" in a message would become that token: a prompt injection, not text.
    for marker in CONTROL_MARKERS:
        if marker in text:
            raise ChatRequestError(
                f"`{param}` contains the control marker {marker!r}, which would be read as a control token; remove it.",
                param,
            )
    m = SPECIAL_TOKEN.search(text)
    if m:
        raise ChatRequestError(
            f"`{param}` contains the special token {m.group(0)!r}, which would be read as a control token; remove it.",
            param,
        )


def content_text(content, param: str, *, required: bool) -> str:
    if content is None:
        if required:
            raise ChatRequestError(f"`{param}` is required.", param)
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatRequestError(f"`{param}` must be a string or a list of text parts.", param)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ChatRequestError(f"`{param}[{j}]` has type {kind!r}; only text parts are supported.", f"{param}[{j}]")
        if not isinstance(part.get("text"), str):
            raise ChatRequestError(f"`{param}[{j}].text` must be a string (a text part's text).", f"{param}[{j}].text")
        texts.append(part["text"])
    return "".join(texts)


def check_tools(tools, param: str) -> list[str]:
    if not isinstance(tools, list):
        raise ChatRequestError(f"`{param}` must be a list of tools.", param)
    names: list[str] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise ChatRequestError(
                f'`{param}[{i}]` must be {{"type": "function", "function": {{...}}}}.', f"{param}[{i}]"
            )
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise ChatRequestError(
                f"`{param}[{i}].function.name` {name!r} must match ^[A-Za-z0-9_-]{{1,64}}$.",
                f"{param}[{i}].function.name",
            )
        if name in names:
            raise ChatRequestError(f"Tool name {name!r} is declared twice.", f"{param}[{i}].function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ChatRequestError(
                f"`{param}[{i}].function.parameters` must be a JSON Schema object.", f"{param}[{i}].function.parameters"
            )
        try:
            check_is_schema(params or {}, f"{param}[{i}].function.parameters")
        except InvalidSchema as e:
            raise ChatRequestError(f"The tool's parameters are not a valid JSON Schema: {e}.", e.path) from None
        check_text(json.dumps(fn, ensure_ascii=False), f"{param}[{i}].function")
        names.append(name)
    return names


def check_tool_calls(calls, param: str, seen_ids: set[str]) -> list[str]:
    if not isinstance(calls, list):
        raise ChatRequestError(f"`{param}` must be a list.", param)
    ids = []
    for j, call in enumerate(calls):
        p = f"{param}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(call.get("id"), str) or not call["id"]:
            raise ChatRequestError(f"`{p}` must have an `id` and a `function`.", p)
        if call["id"] in seen_ids:
            raise ChatRequestError(f"Tool call id {call['id']!r} is used twice.", f"{p}.id")
        seen_ids.add(call["id"])
        ids.append(call["id"])
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise ChatRequestError(
                f"`{p}.function.name` {name!r} must match ^[A-Za-z0-9_-]{{1,64}}$.", f"{p}.function.name"
            )
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except (ValueError, RecursionError):  # RecursionError: nested too deeply to read
            args = None
        if not isinstance(args, dict):
            raise ChatRequestError(f"`{p}.function.arguments` must be a JSON object.", f"{p}.function.arguments")
        for key, value in args.items():
            if not PARAM_NAME.fullmatch(key):
                raise ChatRequestError(
                    f"Argument name {key!r} in `{p}` cannot be written as a parameter name.", f"{p}.function.arguments"
                )
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            if PARAMETER_END in text:
                raise ChatRequestError(
                    f"Argument {key!r} of `{p}` contains {PARAMETER_END!r}, which would end the parameter early.",
                    f"{p}.function.arguments",
                )
            check_text(text, f"{p}.function.arguments")
    return ids


def check_options(body: dict, tool_names: list[str]) -> None:
    choice = body.get("tool_choice")
    if choice is not None:
        named = (
            isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
        )
        if not (choice in TOOL_CHOICES or named):
            raise ChatRequestError(
                '`tool_choice` must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.',
                "tool_choice",
            )
        if choice != "none" and not tool_names:
            raise ChatRequestError(f"`tool_choice` {choice!r} needs `tools`.", "tool_choice")
        if named and choice["function"].get("name") not in tool_names:
            raise ChatRequestError(
                f"`tool_choice` names {choice['function'].get('name')!r}, which is not a declared tool.", "tool_choice"
            )
    effort = body.get("reasoning_effort")
    if effort is not None and effort != "none" and effort not in EFFORT_ALIASES:
        raise ChatRequestError(
            f"`reasoning_effort` {effort!r} must be one of none, minimal, low, medium, high, xhigh, max.",
            "reasoning_effort",
        )
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise ChatRequestError("`chat_template_kwargs` must be an object.", "chat_template_kwargs")
        for key in THINKING_KEYS:
            if key in kwargs and not isinstance(kwargs[key], bool):
                raise ChatRequestError(
                    f"`chat_template_kwargs.{key}` must be a boolean.", f"chat_template_kwargs.{key}"
                )


def validate_chat_request(body: dict) -> list[str]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("`messages` must be a non-empty list.", "messages")
    warnings: list[str] = []
    # NOTE: an absent list is None, never any falsy value: the document types these as lists
    tools = body.get("tools")
    tool_names = check_tools([] if tools is None else tools, "tools")
    seen_ids: set[str] = set()
    open_ids: list[str] = []  # calls of the latest assistant turn still awaiting a result
    for i, msg in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            role = msg.get("role") if isinstance(msg, dict) else None
            names = ", ".join((*ROLES, *ROLE_ALIASES))
            raise ChatRequestError(f"`{p}.role` {role!r} must be one of {names}.", f"{p}.role")
        role = msg["role"]
        if msg.get("tool_calls") and role != "assistant":
            raise ChatRequestError(f"`{p}` has tool_calls but only assistant messages may.", f"{p}.tool_calls")
        if "name" in msg:
            warnings.append(f"{p}.name is ignored by the DeepSeek-V4 chat format")
        text = content_text(msg.get("content"), f"{p}.content", required=role in ("user", "tool"))
        check_text(text, f"{p}.content")
        if role == "system" and msg.get("tools") is not None:
            tool_names += check_tools(msg["tools"], f"{p}.tools")
            if len(set(tool_names)) != len(tool_names):
                raise ChatRequestError("A tool name is declared twice.", f"{p}.tools")
        elif role == "assistant":
            for key in ("reasoning_content", "reasoning"):
                if isinstance(msg.get(key), str):
                    check_text(msg[key], f"{p}.{key}")
            calls = msg.get("tool_calls")
            open_ids = check_tool_calls([] if calls is None else calls, f"{p}.tool_calls", seen_ids)
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id not in open_ids:
                raise ChatRequestError(
                    f"`{p}.tool_call_id` {call_id!r} does not match a call of the preceding assistant message.",
                    f"{p}.tool_call_id",
                )
            open_ids.remove(call_id)
            if TOOL_RESULT_END in text:
                raise ChatRequestError(
                    f"`{p}.content` contains {TOOL_RESULT_END!r}, which would end the tool result early.",
                    f"{p}.content",
                )
        else:
            open_ids = []
    check_options(body, tool_names)
    return warnings
