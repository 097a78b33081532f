"""ChatOutput: a chat request's generated text -> OpenAI message deltas and the final message.

One StreamingChatParser per request serves both answers, so a stream reassembles to
exactly the non-stream message. parallel_tool_calls=false keeps only the first call
(truncation; constrained requests are also held to one call by their grammar).

    feed(text) -> delta dict | None      {"reasoning_content", "reasoning", "content",
    finish()   -> delta dict | None       "tool_calls": [{index, id?, type?, function}]}
    message()  -> choices[0].message      finish_reason(engine_reason)
Raises ToolParseError (chat_parse) when the model writes a malformed tool block.
"""

from __future__ import annotations

from typing import Any

from dspark_loop.api.chat.parse import ChatDelta, StreamingChatParser, new_call_id


class ChatOutput:
    def __init__(self, start_in_reasoning: bool, *, parallel_tool_calls: bool = True, call_id=new_call_id):
        self.parser = StreamingChatParser(start_in_reasoning, call_id=call_id)
        self.max_calls = None if parallel_tool_calls else 1
        self._reasoning: list[str] = []  # text pieces so far
        self._content: list[str] = []

    def feed(self, text: str) -> dict | None:
        return self._delta(self.parser.feed(text)) if text else None

    def finish(self) -> dict | None:
        return self._delta(self.parser.finish())

    @property
    def content(self) -> str | None:
        return "".join(self._content) or None

    @property
    def reasoning_content(self) -> str | None:
        return "".join(self._reasoning) or None

    @property
    def tool_calls(self) -> list[dict]:
        """The calls, in order; one cut short (length, a stop string) as far as it was written,
        as the stream sent it (finish_reason then keeps the engine's reason)."""
        calls = self.parser.tool_calls
        return calls if self.max_calls is None else calls[: self.max_calls]

    @property
    def tool_calls_complete(self) -> bool:
        if self.max_calls is not None and self.parser.num_closed_calls >= self.max_calls:
            return True  # the kept call is whole; what followed it is dropped
        return self.parser.tool_calls_complete

    @property
    def truncated_calls(self) -> int:
        """Calls dropped by parallel_tool_calls=false."""
        if self.max_calls is None:
            return 0
        return max(0, len(self.parser.tool_calls) - self.max_calls)

    def finish_reason(self, engine_reason: str) -> str:
        """ "tool_calls" only when generation ended on EOS/stop and every kept call is whole."""
        if engine_reason == "stop" and self.tool_calls and self.tool_calls_complete:
            return "tool_calls"
        return engine_reason

    def message(self) -> dict:
        reasoning = self.reasoning_content
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": self.content,
            "reasoning_content": reasoning,
            "reasoning": reasoning,
        }
        if self.tool_calls:
            msg["tool_calls"] = [{**c, "function": dict(c["function"])} for c in self.tool_calls]
        return msg

    def _delta(self, deltas: list[ChatDelta]) -> dict | None:
        """One OpenAI delta for a batch of parser moves; fragments of a call are merged."""
        reasoning, content = [], []
        calls: dict[int, dict] = {}
        for d in deltas:
            if d.kind == "reasoning":
                reasoning.append(d.text)
            elif d.kind == "content":
                content.append(d.text)
            else:
                tc = d.tool_call
                assert tc is not None  # a "tool_call" delta carries one
                if self.max_calls is not None and tc["index"] >= self.max_calls:
                    continue
                merged = calls.setdefault(tc["index"], {"index": tc["index"]})
                for key in ("id", "type"):
                    if key in tc:
                        merged[key] = tc[key]
                fn = merged.setdefault("function", {})
                if "name" in tc["function"]:
                    fn["name"] = tc["function"]["name"]
                    fn.setdefault("arguments", "")
                if "arguments" in tc["function"]:
                    fn["arguments"] = fn.get("arguments", "") + tc["function"]["arguments"]
        out: dict = {}
        if reasoning:
            text = "".join(reasoning)
            self._reasoning.append(text)
            out["reasoning_content"] = out["reasoning"] = text
        if content:
            text = "".join(content)
            self._content.append(text)
            out["content"] = text
        if calls:
            out["tool_calls"] = [calls[i] for i in sorted(calls)]
        return out or None
