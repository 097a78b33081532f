"""OpenAI chat messages -> DeepSeek-V4 prompt text (the release's encoder rules).

    BOS [effort paragraph] system [+ tools preamble]
    <｜User｜>text<｜Assistant｜><think>reasoning</think>content [tool block] EOS
    <｜User｜><tool_result>r1</tool_result>\\n\\n<tool_result>r2</tool_result><｜Assistant｜><think>

Markers are ASCII `<` `>` around U+FF5C `｜`; `▁` is U+2581. The prompt already starts with
BOS: tokenise it with add_special_tokens=False.
"""

from __future__ import annotations

import json

from dspark_loop.config.server_config import THINKING_KEYS

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"
TOOL_CALLS_START = f"<{DSML}tool_calls>"
TOOL_CALLS_END = f"</{DSML}tool_calls>"
CHAT_MARKERS = (THINK_START, THINK_END, DSML)  # special tokens the output parser reads as text
INVOKE_END = f"</{DSML}invoke>"
PARAMETER_END = f"</{DSML}parameter>"
TOOL_RESULT_START = "<tool_result>"
TOOL_RESULT_END = "</tool_result>"

EFFORT_TEXT = {
    "low": "",
    "high": (
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem "
        "to resolve the root cause, rigorously stress-testing your logic against all potential "
        "paths, edge cases, and adversarial scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate "
        "step, considered alternative, and rejected hypothesis to ensure absolutely no "
        "assumption is left unchecked.\n\n"
    ),
    "max": (
        "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
        "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
        "exhaustively decompose the problem into its most fundamental components, trace every "
        "causal chain to its root, and resolve the underlying cause rather than any surface "
        "symptom.\n"
        "Do not stop reasoning until you have independently verified the solution from multiple "
        "angles and are certain that no assumption remains unchecked and no error remains "
        "undiscovered.\n\n"
    ),
}

# reasoning_effort as clients send it (DeepSeek API, vLLM, OpenAI) -> the encoder's table.
EFFORT_ALIASES = {"minimal": "low", "low": "low", "medium": "high", "high": "high", "xhigh": "high", "max": "max"}

TOOLS_PREAMBLE = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "{TOOL_CALLS_START}" block like the following:

{TOOL_CALLS_START}
<{DSML}invoke name="$TOOL_NAME">
<{DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE{PARAMETER_END}
...
{INVOKE_END}
<{DSML}invoke name="$TOOL_NAME2">
...
{INVOKE_END}
{TOOL_CALLS_END}

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {THINK_START}), you MUST output your complete reasoning inside {THINK_START}...{THINK_END} BEFORE any tool calls or final response.

Otherwise, output directly after {THINK_END} with tool calls or final response.

### Available Tool Schemas

{{schemas}}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""


def _thinking_flag(kwargs: dict) -> bool | None:
    """What chat_template_kwargs say of thinking: False if either key is false, True if
    one is true, None if neither is given."""
    given = [kwargs[k] for k in THINKING_KEYS if isinstance(kwargs.get(k), bool)]
    return all(given) if given else None


def chat_options(body: dict, defaults: dict | None = None) -> tuple[bool, str | None]:
    """(thinking, effort) from a chat request body, as DeepSeek's API and vLLM map them.

    Thinking is on unless reasoning_effort is "none", chat_template_kwargs.thinking /
    enable_thinking is false, or DeepSeek's `thinking: {"type": "disabled"}`. defaults: the
    server's chat_template_kwargs (--default-chat-template-kwargs), which the request's own
    chat_template_kwargs or `thinking` field override. With nothing given the effort is
    None: no paragraph, the same prompt as "low" (the encoder's default). Call after
    validate_chat_request; an unknown effort raises ValueError.
    """
    thinking = True
    for kwargs in (defaults or {}, body.get("chat_template_kwargs") or {}):
        flag = _thinking_flag(kwargs)
        if flag is not None:
            thinking = flag
    asked = body.get("thinking")
    if isinstance(asked, dict) and asked.get("type") in ("enabled", "disabled"):
        thinking = asked["type"] == "enabled"
    effort = body.get("reasoning_effort")
    if effort is None:
        return thinking, None
    if effort == "none":
        return False, None
    if effort not in EFFORT_ALIASES:
        raise ValueError(f"unknown reasoning_effort {effort!r}")
    return thinking, (EFFORT_ALIASES[effort] if thinking else None)


def message_text(content) -> str:
    """`content` as one string: None -> "", a list of {type: "text"} parts -> joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def arguments_object(arguments) -> dict:
    """function.arguments as a dict; clients send a JSON string or an object."""
    if isinstance(arguments, str):
        return json.loads(arguments) if arguments.strip() else {}
    return dict(arguments or {})


def render_tool_block(tool_calls: list[dict]) -> str:
    invokes = []
    for call in tool_calls:
        fn = call["function"]
        params = []
        for key, value in arguments_object(fn.get("arguments")).items():
            if isinstance(value, str):
                params.append(f'<{DSML}parameter name="{key}" string="true">{value}{PARAMETER_END}')
            else:
                text = json.dumps(value, ensure_ascii=False)
                params.append(f'<{DSML}parameter name="{key}" string="false">{text}{PARAMETER_END}')
        invokes.append(f'<{DSML}invoke name="{fn["name"]}">\n' + "\n".join(params) + f"\n{INVOKE_END}")
    return f"\n\n{TOOL_CALLS_START}\n" + "\n".join(invokes) + f"\n{TOOL_CALLS_END}"


def tools_text(tools: list[dict]) -> str:
    schemas = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return TOOLS_PREAMBLE.replace("{schemas}", schemas)


def _turns(messages: list[dict]) -> list[dict]:
    """Group tool results into user turns, ordered by the preceding assistant's call order.

    Returns {"role": "system"|"user"|"assistant", ...}; a user turn carries `parts` (tool
    results first, then the user's text, joined by "\\n\\n").
    """
    turns: list[dict] = []
    call_order: dict[str, int] = {}
    for msg in messages:
        role = msg["role"]
        if role == "tool":
            result = f"{TOOL_RESULT_START}{message_text(msg.get('content'))}{TOOL_RESULT_END}"
            call_id = msg.get("tool_call_id")
            rank = len(call_order) if call_id is None else call_order.get(call_id, len(call_order))
            if not turns or turns[-1]["role"] != "user" or turns[-1]["text_parts"]:
                turns.append({"role": "user", "results": [], "text_parts": []})
            turns[-1]["results"].append((rank, len(turns[-1]["results"]), result))
        elif role == "user":
            if turns and turns[-1]["role"] == "user" and turns[-1]["results"] and not turns[-1]["text_parts"]:
                turns[-1]["text_parts"].append(message_text(msg.get("content")))
            else:
                turns.append({"role": "user", "results": [], "text_parts": [message_text(msg.get("content"))]})
        else:
            if role == "assistant":
                call_order = {c.get("id"): i for i, c in enumerate(msg.get("tool_calls") or [])}
            turns.append(dict(msg))
    for turn in turns:
        if turn["role"] == "user":
            # NOTE: results follow the call order of the assistant turn that asked for them,
            # not the order clients happened to append them in (the encoder's rule).
            turn["parts"] = [r for _, _, r in sorted(turn.pop("results"))] + turn.pop("text_parts")
    return turns


def render_messages(
    messages: list[dict], *, tools: list[dict] | None = None, thinking: bool, reasoning_effort: str | None = None
) -> str:
    """The prompt for `messages`, ending in the generation prompt after a final user turn.

    History rule (thinking mode): assistant turns before the last user/tool turn lose their
    reasoning; with tools declared they keep the empty `<think></think>` frame, without tools
    only `</think>` remains. A trailing assistant message keeps its reasoning.
    """
    declared = list(tools or [])
    for msg in messages:
        if msg["role"] == "system" and msg.get("tools"):
            declared.extend(msg["tools"])
    turns = _turns(messages)
    if declared and not any(t["role"] == "system" for t in turns):
        turns.insert(0, {"role": "system", "content": ""})
    last_user = max((i for i, t in enumerate(turns) if t["role"] == "user"), default=-1)

    out = [BOS]
    if thinking and reasoning_effort:
        out.append(EFFORT_TEXT[reasoning_effort])
    tools_attached = False
    think_open = False  # the last assistant prefix ended in <think>
    for i, turn in enumerate(turns):
        role = turn["role"]
        if role == "system":
            text = message_text(turn.get("content"))
            if declared and not tools_attached:
                text += "\n\n" + tools_text(declared)
                tools_attached = True
            out.append(text)
            think_open = False
        elif role == "user":
            out.append(USER + "\n\n".join(turn["parts"]) + ASSISTANT)
            think_open = thinking and (i == last_user or bool(declared))
            out.append(THINK_START if think_open else THINK_END)
        else:
            if i == 0 or turns[i - 1]["role"] != "user":
                # An assistant turn with no user turn before it still needs its prefix.
                think_open = thinking and (i > last_user or bool(declared))
                out.append(ASSISTANT + (THINK_START if think_open else THINK_END))
            if think_open:
                reasoning = turn.get("reasoning_content") or turn.get("reasoning") or ""
                out.append((reasoning if i > last_user else "") + THINK_END)
            out.append(message_text(turn.get("content")))
            if turn.get("tool_calls"):
                out.append(render_tool_block(turn["tool_calls"]))
            out.append(EOS)
            think_open = False
    return "".join(out)
