"""DeepSeek-V4 output text -> reasoning, content and OpenAI tool calls.

One incremental machine serves both paths (ChatOutput feeds it): a whole answer is
feed(text) + finish(), so a stream cut anywhere reassembles to exactly the whole message.

    reasoning ──</think>──> content ──\\n\\n<｜DSML｜tool_calls>──> calls ──> invoke ──> param
        └───────────<｜DSML｜tool_calls>──────────────┘          ^──────┴─────────┘
    EOS ends the text anywhere; a block cut short (length, stop string) is incomplete: its
    calls stand as far as they were written, and a block cut before its first call's name
    is returned as content (its raw text: the answer is never empty when tokens were made);
    a block of the wrong shape raises ToolParseError.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import NoReturn

from dspark_loop.api.chat.render import (
    DSML,
    EOS,
    INVOKE_END,
    PARAMETER_END,
    THINK_END,
    TOOL_CALLS_END,
    TOOL_CALLS_START,
)

INVOKE_START = f'<{DSML}invoke name="'
PARAMETER_START = f'<{DSML}parameter name="'
PARAM_HEADER = re.compile(r'([^"<>\n]+)" string="(true|false)"')
MAX_HEADER_LEN = 256


class ToolParseError(ValueError):
    pass


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ChatDelta:
    kind: str  # "reasoning" | "content" | "tool_call"
    text: str = ""
    tool_call: dict | None = None  # OpenAI's choices[].delta.tool_calls[i]


def _held_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that could still grow into one of `markers`.
    Only a tail that starts with the marker's first character can (found with str.find:
    most chunks hold none, and this runs for every chunk of every chat stream)."""
    best = 0
    for marker in markers:
        n = min(len(marker) - 1, len(text))
        tail = text[len(text) - n :]
        i = tail.find(marker[0])
        while 0 <= i and n - i > best:
            if marker.startswith(tail[i:]):
                best = n - i
                break
            i = tail.find(marker[0], i + 1)
    return best


class StreamingChatParser:
    def __init__(self, start_in_reasoning: bool, *, call_id=new_call_id):
        self._state = "reasoning" if start_in_reasoning else "content"
        self._raw = ""  # text not yet scanned for EOS
        self._buf = ""  # text the machine has not consumed
        self._ended = False  # EOS seen: the rest is ignored
        self._call_id = call_id
        self._param: tuple[str, bool] | None = None  # (name, is_string) of the open parameter
        self._param_names: set[str] = set()
        self.tool_calls: list[dict] = []  # OpenAI shape, arguments growing
        self.num_closed_calls = 0  # calls whose </｜DSML｜invoke> has been read
        self.tool_calls_complete = True
        self.error: ToolParseError | None = None
        self._block: list[str] | None = None  # the raw text of a block until its first call is named

    def feed(self, text: str) -> list[ChatDelta]:
        if self.error:
            raise self.error
        if self._ended:
            return []
        self._raw += text
        cut = self._raw.find(EOS)
        if cut >= 0:
            self._take(self._raw[:cut])
            self._raw, self._ended = "", True
        else:
            keep = _held_len(self._raw, (EOS,))
            self._take(self._raw[: len(self._raw) - keep])
            self._raw = self._raw[len(self._raw) - keep :]
        return self._run()

    def _take(self, text: str) -> None:
        self._buf += text
        if self._block is not None:
            self._block.append(text)

    def finish(self) -> list[ChatDelta]:
        if self.error:
            raise self.error
        if self._state != "done":  # after the block only EOS may come; a cut EOS is dropped
            self._take(self._raw)
        self._raw = ""
        out = self._run()
        if self._state in ("reasoning", "content") and self._buf:
            out.append(ChatDelta(self._state, self._buf))
        elif self._state not in ("reasoning", "content", "done"):
            self.tool_calls_complete = False
            if self._block is not None:  # cut before its first call's name: its raw text
                out.append(ChatDelta("content", "".join(self._block)))
        self._buf = ""
        return out

    def _run(self) -> list[ChatDelta]:
        out: list[ChatDelta] = []
        try:
            while self._step(out):
                pass
        except ToolParseError as e:
            self.error = e
            raise
        return out

    def _fail(self, what: str) -> NoReturn:
        raise ToolParseError(f"malformed tool call block: {what} (at {self._buf[:60]!r})")

    def _expect(self, options: tuple[str, ...]) -> str | None:
        """Consume one of `options` after optional whitespace; None while undecided."""
        self._buf = self._buf.lstrip()
        for opt in options:
            if self._buf.startswith(opt):
                self._buf = self._buf[len(opt) :]
                return opt
        if self._buf and not any(opt.startswith(self._buf) for opt in options):
            self._fail("expected " + " or ".join(repr(o) for o in options))
        return None

    def _args(self, out: list[ChatDelta], fragment: str) -> None:
        call = self.tool_calls[-1]
        call["function"]["arguments"] += fragment
        out.append(
            ChatDelta("tool_call", tool_call={"index": len(self.tool_calls) - 1, "function": {"arguments": fragment}})
        )

    def _step(self, out: list[ChatDelta]) -> bool:
        """Advance one move; False when more text is needed."""
        state, buf = self._state, self._buf
        if state in ("reasoning", "content"):
            markers = (TOOL_CALLS_START, THINK_END) if state == "reasoning" else (TOOL_CALLS_START,)
            hits = [(buf.find(m), m) for m in markers if m in buf]
            if not hits:
                keep = _held_len(buf, ("\n\n" + TOOL_CALLS_START,) + markers)
                if len(buf) > keep:
                    out.append(ChatDelta(state, buf[: len(buf) - keep]))
                    self._buf = buf[len(buf) - keep :]
                return False
            pos, marker = min(hits)
            text = buf[:pos]
            if marker == TOOL_CALLS_START:
                # NOTE: the "\n\n" before a tool block belongs to the block, not the text.
                lead = "\n\n" if text.endswith("\n\n") else ""
                text = text[: len(text) - len(lead)]
                self._state, self._block = "calls", [lead, marker, buf[pos + len(marker) :]]
            else:
                self._state = "content"
            if text:
                out.append(ChatDelta(state, text))
            self._buf = buf[pos + len(marker) :]
            return True
        if state in ("calls", "calls_next"):
            opts = (INVOKE_START,) if state == "calls" else (INVOKE_START, TOOL_CALLS_END)
            got = self._expect(opts)
            if got is None:
                return False
            self._state = "invoke_name" if got == INVOKE_START else "done"
            return True
        if state == "invoke_name":
            end = buf.find('">')
            if end < 0:
                if (
                    len(buf) > MAX_HEADER_LEN
                    or any(c in buf for c in "<>\n")
                    or (buf.find('"') >= 0 and buf.find('"') < len(buf) - 1)
                ):
                    self._fail("bad invoke name")
                return False
            name = buf[:end]
            if not name or any(c in name for c in '"<>\n'):
                self._fail("bad invoke name")
            call = {"id": self._call_id(), "type": "function", "function": {"name": name, "arguments": ""}}
            self.tool_calls.append(call)
            self._block = None
            out.append(
                ChatDelta(
                    "tool_call",
                    tool_call={
                        "index": len(self.tool_calls) - 1,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": name},
                    },
                )
            )
            self._buf, self._state, self._param_names = buf[end + 2 :], "invoke", set()
            return True
        if state == "invoke":
            got = self._expect((PARAMETER_START, INVOKE_END))
            if got is None:
                return False
            if got == INVOKE_END:
                self._args(out, "}" if self._param_names else "{}")
                self.num_closed_calls += 1
                self._state = "calls_next"
            else:
                self._state = "param_header"
            return True
        if state == "param_header":
            end = buf.find(">")
            if end < 0:
                if len(buf) > MAX_HEADER_LEN or "<" in buf:
                    self._fail("bad parameter header")
                return False
            m = PARAM_HEADER.fullmatch(buf[:end])
            if not m:
                self._fail("bad parameter header")
            name, is_string = m.group(1), m.group(2) == "true"
            if name in self._param_names:
                self._fail(f"parameter {name!r} given twice")
            lead = ", " if self._param_names else "{"
            self._param_names.add(name)
            self._args(out, lead + json.dumps(name, ensure_ascii=False) + ": " + ('"' if is_string else ""))
            self._param, self._buf, self._state = (name, is_string), buf[end + 1 :], "param_value"
            return True
        if state == "param_value":
            assert self._param is not None  # set with the param_value state
            name, is_string = self._param
            end, dsml = buf.find(PARAMETER_END), buf.find(DSML)
            if (
                dsml >= 0
                and (end < 0 or dsml < end + 2)
                and not (dsml >= 2 and PARAMETER_END.startswith(buf[dsml - 2 :]))
            ):
                self._fail(f"parameter {name!r} not closed")
            if end < 0:
                if is_string:
                    keep = _held_len(buf, (PARAMETER_END, DSML))
                    if len(buf) > keep:
                        self._args(out, json.dumps(buf[: len(buf) - keep], ensure_ascii=False)[1:-1])
                        self._buf = buf[len(buf) - keep :]
                return False
            value, self._buf = buf[:end], buf[end + len(PARAMETER_END) :]
            if is_string:
                self._args(out, json.dumps(value, ensure_ascii=False)[1:-1] + '"')
            else:
                try:
                    parsed = json.loads(value)
                except ValueError:
                    self._fail(f'parameter {name!r} is string="false" but not JSON: {value!r}')
                self._args(out, json.dumps(parsed, ensure_ascii=False))
            self._state = "invoke"
            return True
        # done: only whitespace may follow the block.
        if buf.strip():
            self._fail("text after the tool_calls block")
        self._buf = ""
        return False
