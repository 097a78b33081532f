"""ChatCompletionRequest: the /v1/chat/completions body, decoded as strictly as completions'.

messages / tools / tool_choice stay plain JSON here: chat_validate checks them rule by
rule (a 400 naming the message and field). The generation fields are completions' own
(schemas.GenerationFields), so both routes refuse the same values.
"""

from __future__ import annotations

from typing import Any

from dspark_loop.api.schemas import GenerationFields, ResponseFormat, StructuredOutputs


class ChatCompletionRequest(GenerationFields):
    messages: Any = None
    # tools and the chat format
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None  # DeepSeek's API: {"type": "enabled" | "disabled"}
    response_format: ResponseFormat = None  # text | json_object | json_schema (api/structured/)
    structured_outputs: StructuredOutputs = None  # vLLM's: {"json": schema} | {"json_object": true}
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def format_fields(self) -> dict:
        """The fields chat_validate / chat_options read, as the plain dict they expect."""
        body = {"messages": self.messages}
        for key in ("tools", "tool_choice", "reasoning_effort", "chat_template_kwargs", "thinking"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        return body
