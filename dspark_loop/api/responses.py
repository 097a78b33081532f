"""Response bodies as msgspec Structs: what /openapi.json promises each route answers.

Request bodies are the decoders themselves (schemas.py, chat_schemas.py); these are the
answers. tests/e2e/test_openapi_fuzz.py checks every answer the server gives against the
document built from them, so a route that drifts from its struct fails a test.
Streams (stream=true) answer text/event-stream whose events are the *Chunk structs.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Body(msgspec.Struct, omit_defaults=True):
    pass


class ErrorDetail(Body):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Body):
    error: ErrorDetail


class PromptTokensDetails(Body):
    cached_tokens: int


class Usage(Body):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(Body):
    """logprobs_format.LogprobsFormatter.completion (echo: the prompt's first entry is null)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class ChatTopLogprob(Body):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(Body):
    """logprobs_format.LogprobsFormatter.chat."""

    content: list[ChatTokenLogprob] | None


class SpeculationStats(Body):
    """`"speculation": {"return_stats": true}`: this request's DSpark figures (all choices)."""

    proposed: int  # drafts verified
    accepted: int  # drafts accepted (the verifies produced these + one token each)
    verify_steps: int  # steps that verified at least one draft


class CompletionChoice(Body):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionResponse(Body):
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    speculation: SpeculationStats | None = None


class CompletionChunk(CompletionResponse):
    """One `data:` event of a /v1/completions stream (choices [] in the usage event)."""


class ToolCallFunction(Body):
    name: str | None = None
    arguments: str | None = None


class ToolCall(Body):
    index: int | None = None
    id: str | None = None
    type: str | None = None
    function: ToolCallFunction | None = None


class ChatMessage(Body):
    role: str
    content: str | None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(Body):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None = None


class ChatCompletionResponse(Body):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    speculation: SpeculationStats | None = None


class ChatDelta(Body):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChunkChoice(Body):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None = None


class ChatCompletionChunk(Body):
    """One `data:` event of a /v1/chat/completions stream."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    speculation: SpeculationStats | None = None


class ModelCard(Body):
    id: str
    object: str
    created: int
    owned_by: str
    root: str
    parent: str | None
    max_model_len: int
    permission: list[Any]


class ModelList(Body):
    object: str
    data: list[ModelCard]


class TokenizeResponse(Body):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str | None] | None = None


class DetokenizeResponse(Body):
    prompt: str


class HealthResponse(Body):
    status: str  # ok | not_ready | draining | restarting | dead
    reason: str | None = None
