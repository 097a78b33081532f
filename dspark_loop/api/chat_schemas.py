"""ChatCompletionRequest: the /v1/chat/completions body, decoded as strictly as completions'.

messages / tools / tool_choice stay plain JSON here: chat_validate checks them rule by
rule (a 400 naming the message and field). The generation fields share completions'
rules through as_completion_request(), so both routes refuse the same values.
"""
from __future__ import annotations

from typing import Any

import msgspec

from dspark_loop.api.schemas import CompletionRequest, StreamOptions, Strict

# Fields whose meaning (and validation) is exactly /v1/completions'.
SHARED_FIELDS = ("model", "max_tokens", "max_completion_tokens", "min_tokens", "stop",
                 "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "seed", "stream",
                 "stream_options", "temperature", "top_p", "top_k", "n",
                 "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias",
                 "user")


class ChatCompletionRequest(Strict):
    messages: Any = None
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    min_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    # tools and the chat format
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None  # DeepSeek's API: {"type": "enabled" | "disabled"}
    response_format: dict[str, Any] | None = None  # {"type": "text"} only
    # greedy / neutral values only
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def format_fields(self) -> dict:
        """The fields chat_validate / chat_options read, as the plain dict they expect."""
        body = {"messages": self.messages}
        for key in ("tools", "tool_choice", "reasoning_effort", "chat_template_kwargs", "thinking"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        return body


def as_completion_request(req: ChatCompletionRequest, **overrides) -> CompletionRequest:
    fields = {name: getattr(req, name) for name in SHARED_FIELDS}
    return msgspec.structs.replace(CompletionRequest(**fields), **overrides)
