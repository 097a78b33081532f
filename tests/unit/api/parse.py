"""parse_completion: a whole completion through the one output path (ChatOutput)."""

from __future__ import annotations

from dspark_loop.api.chat.output import ChatOutput
from dspark_loop.api.chat.parse import new_call_id


def parse_completion(text: str, *, start_in_reasoning: bool, call_id=new_call_id) -> ChatOutput:
    out = ChatOutput(start_in_reasoning, call_id=call_id)
    out.feed(text)
    out.finish()
    return out
