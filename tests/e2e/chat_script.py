"""The scripted double's entries for the chat e2e tests: prompt tails -> model outputs.

Keys are written out literally (not produced by chat_render), so a match proves the
server rendered the conversation exactly as the DeepSeek-V4 format says.
"""

from __future__ import annotations

import json
import os

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
D = "｜DSML｜"


def invoke(name: str, params: list[tuple[str, str, bool]]) -> str:
    lines = [f'<{D}parameter name="{k}" string="{"true" if s else "false"}">{v}</{D}parameter>' for k, v, s in params]
    return f'<{D}invoke name="{name}">\n' + "\n".join(lines) + f"\n</{D}invoke>"


def block(*invokes: str) -> str:
    return f"\n\n<{D}tool_calls>\n" + "\n".join(invokes) + f"\n</{D}tool_calls>"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
PARIS_CALL = invoke("get_weather", [("city", "Paris", True), ("days", "2", False)])
ROME_CALL = invoke("get_weather", [("city", "Rome", True)])

ENTRIES = [
    # plain chat and thinking: the generation prompt differs (</think> vs <think>)
    {"key": f"{USER}Say hi.{ASSISTANT}</think>", "output": "Hello there!"},
    {"key": f"{USER}Say hi.{ASSISTANT}<think>", "output": "The user greets me.</think>Hello there!"},
    # a tool call, then the turn that carries its result
    {"key": f"{USER}Weather in Paris?{ASSISTANT}</think>", "output": block(PARIS_CALL)},
    {
        "key": f"{USER}Weather in Paris?{ASSISTANT}</think>{block(PARIS_CALL)}{EOS}"
        f'{USER}<tool_result>{{"temp_c": 18}}</tool_result>{ASSISTANT}</think>',
        "output": "It is 18 degrees in Paris.",
    },
    # two calls in one block (parallel), streamed
    {"key": f"{USER}Paris and Rome?{ASSISTANT}</think>", "output": "Checking both." + block(PARIS_CALL, ROME_CALL)},
    # malformed: string="maybe" is no DSML parameter header
    {
        "key": f"{USER}Break it.{ASSISTANT}</think>",
        "output": block(
            f'<{D}invoke name="get_weather">\n<{D}parameter name="city" '
            f'string="maybe">Paris</{D}parameter>\n</{D}invoke>'
        ),
    },
]


def write_script(directory: str) -> str:
    path = os.path.join(directory, "chat_script.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(ENTRIES, f, ensure_ascii=False)
    return path


def scripted_env(directory: str) -> dict:
    return {
        "DSPARK_TEST_RUNNER": "dspark_testing.scripted_runner:ScriptedRunner",
        "DSPARK_TEST_SCRIPT": write_script(directory),
    }
