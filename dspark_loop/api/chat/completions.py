"""POST /v1/chat/completions: messages -> DeepSeek-V4 prompt -> engine -> OpenAI chat answer.

    validate (chat_validate, 400s) -> render (chat_render, BOS first, no special tokens
    added) -> [constraint for required/named/strict tools or a response_format schema,
    built off the loop] ->
    engine.generate -> ChatOutput splits reasoning / content / tool_calls

Streaming, usage, finish reasons and engine failures are the shared skeleton's
(generation.py); chat adds the role chunk first and turns a malformed tool block into an
error (500, or in a stream an error event then [DONE]).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

from dspark_loop.api.chat.constraint import needs_constraint
from dspark_loop.api.chat.output import ChatOutput
from dspark_loop.api.chat.parse import ToolParseError
from dspark_loop.api.chat.render import CHAT_MARKERS, THINK_START, chat_options, render_messages
from dspark_loop.api.chat.schemas import ChatCompletionRequest
from dspark_loop.api.chat.validate import ChatRequestError, validate_chat_request, with_role_aliases
from dspark_loop.api.context import ServingContext
from dspark_loop.api.errors import ApiError, bad_request, unsupported
from dspark_loop.api.generation.choices import Choices, run_choices
from dspark_loop.api.generation.logprobs_format import LogprobsFormatter
from dspark_loop.api.generation.sampling import sampling_params
from dspark_loop.api.generation.skeleton import Generation, GenerationRoute, OutputError
from dspark_loop.api.structured.build import format_constraint, tool_constraint
from dspark_loop.api.structured.output_format import OutputFormat, check_constrained_options, output_format
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput, TokenLogprob

log = logging.getLogger(__name__)


class ChatCompletion(Generation):
    """One accepted chat request: the prompt, the output parser and the constraint's recipe."""

    req: ChatCompletionRequest
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(
        self,
        ctx: ServingContext,
        req: ChatCompletionRequest,
        prompt_ids: list[int],
        prompt_text: str,
        generate: GenerateRequest,
        tools: list[dict],
        fmt: OutputFormat | None = None,
    ):
        super().__init__(ctx, req, prompt_ids, generate)
        self.tools = tools
        self.format = fmt  # response_format / structured_outputs (None: free text)
        self.start_in_reasoning = prompt_text.endswith(THINK_START)
        self.parallel_tool_calls = req.parallel_tool_calls is not False
        self.output = ChatOutput(self.start_in_reasoning, parallel_tool_calls=self.parallel_tool_calls)
        self.index = 0  # the choice's index (n > 1)
        self.logprobs: list[TokenLogprob] = []  # entries not answered yet (logprobs: true)
        self.formatter = LogprobsFormatter(lambda t: ctx.encoder.decode([t]))

    def note(self, out: RequestOutput, token_ids: list[int]) -> None:
        super().note(out, token_ids)
        self.logprobs += out.logprobs or []

    def take_logprobs(self) -> dict | None:
        if not self.req.logprobs:
            return None
        entries, self.logprobs = self.logprobs, []
        return self.formatter.chat(entries)

    @property
    def constrained_tools(self) -> bool:
        return needs_constraint(self.tools, self.req.tool_choice)

    @property
    def constrained(self) -> bool:
        return self.format is not None or self.constrained_tools

    def chunk(
        self,
        delta: dict,
        reason: str | None = None,
        stop_reason=None,
        continuous: bool = False,
        logprobs: dict | None = None,
    ) -> bytes:
        choice = {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        if reason is not None:
            choice["stop_reason"] = stop_reason
        return self.chunk_event(choice, continuous)

    def feed(self, text: str) -> None:
        with malformed_as_output_error():
            self.output.feed(text)

    def finish_output(self) -> None:
        with malformed_as_output_error():
            self.output.finish()

    def whole_choice(self, reason: str, last: RequestOutput, token_ids: list[int]) -> tuple[dict, str]:
        reason = self.output.finish_reason(reason)
        choice = {
            "index": self.index,
            "message": self.output.message(),
            "logprobs": self.take_logprobs(),
            "finish_reason": reason,
            "stop_reason": last.stop_reason,
        }
        return choice, reason

    def opening_chunks(self, continuous: bool) -> list[bytes]:
        return [self.chunk({"role": "assistant", "content": ""}, continuous=continuous)]

    def delta_chunks(self, out: RequestOutput, continuous: bool) -> tuple[list[bytes], str | None]:
        with malformed_as_output_error():
            delta = self.output.feed(out.new_text)
            tail = self.output.finish() if out.finished else None
        # NOTE: a delta's token logprobs ride on its first chunk (text may lag tokens)
        chunks = [self.chunk(delta, continuous=continuous, logprobs=self.take_logprobs())] if delta else []
        if not out.finished:
            return chunks, None
        assert out.finish_reason is not None  # a finished output says why
        reason = self.output.finish_reason(out.finish_reason)
        chunks.append(
            self.chunk(tail or {}, reason, out.stop_reason, continuous, None if chunks else self.take_logprobs())
        )
        return chunks, reason

    def log_finished(self, reason: str | None) -> None:
        if self.output.truncated_calls:
            log.info(
                "request %s: parallel_tool_calls=false dropped %d call(s)", self.request_id, self.output.truncated_calls
            )
        super().log_finished(reason)


@contextlib.contextmanager
def malformed_as_output_error():
    try:
        yield
    except ToolParseError as e:
        raise OutputError(
            ApiError(500, f"The model wrote a malformed tool call block: {e}", code="malformed_tool_call"),
            "malformed tool call",
        ) from None


def check_chat_options(req: ChatCompletionRequest) -> None:
    if req.thinking is not None and req.thinking.get("type") not in ("enabled", "disabled"):
        raise bad_request('`thinking.type` must be "enabled" or "disabled".', "thinking.type")
    messages = req.messages
    if messages[-1].get("role") not in ("user", "tool"):
        raise bad_request(
            "The last message must be from the user or a tool: the server "
            "generates the next assistant turn (continuing an assistant or "
            "system message is not supported).",
            f"messages[{len(messages) - 1}].role",
        )


def declared_tools(req: ChatCompletionRequest) -> list[dict]:
    tools = list(req.tools or [])
    for msg in req.messages:
        if msg["role"] == "system" and msg.get("tools"):
            tools.extend(msg["tools"])
    return tools


class ChatCompletionsRoute(GenerationRoute):
    def accept(self, body: bytes):
        ctx = self.ctx
        req = self.decode(body, ChatCompletionRequest)
        req.messages = with_role_aliases(req.messages)
        fields = req.format_fields()
        try:
            warnings = validate_chat_request(fields)
            thinking, effort = chat_options(fields, ctx.chat_template_kwargs)
        except ChatRequestError as e:
            raise bad_request(e.message, e.param) from None
        except ValueError as e:
            raise bad_request(str(e), "reasoning_effort") from None
        for w in warnings:
            log.debug("chat request: %s", w)
        check_chat_options(req)
        fmt = output_format(req.response_format, req.structured_outputs)
        # NOTE: tool_choice "none" leaves the request's tools out of the prompt: the model
        # cannot call what it was not shown, and the answer is plain text as OpenAI promises.
        tools = None if req.tool_choice == "none" else req.tools
        prompt_text = render_messages(req.messages, tools=tools, thinking=thinking, reasoning_effort=effort)
        prompt_ids = ctx.encoder.encode_text(prompt_text, add_bos=False)
        try:
            ctx.check_context(len(prompt_ids))
        except ApiError as e:
            e.param = "messages"
            raise
        # chat's default length: the context left (unless --generate-config sets one)
        params = sampling_params(
            req,
            ctx.defaults,
            ctx.encoder,
            len(prompt_ids),
            ctx.max_model_len,
            default_max_tokens=ctx.max_model_len - len(prompt_ids),
            sampling_defaults=ctx.sampling_defaults,
        )
        params = dataclasses.replace(params, keep_special=CHAT_MARKERS)  # the parser reads them; other specials drop
        tools = [] if req.tool_choice == "none" else declared_tools(req)
        choices = []
        for j in range(req.n or 1):  # n > 1: one engine request per choice (its own noise)
            g = GenerateRequest(
                ctx.new_request_id("chatcmpl"),
                prompt_ids,
                dataclasses.replace(params, choice=j),
                arrival_time=time.monotonic(),
            )
            choices.append(ChatCompletion(ctx, req, prompt_ids, prompt_text, g, tools, fmt))
            choices[-1].index = j
        c = choices[0]
        if fmt is not None and c.constrained_tools:
            raise unsupported(
                fmt.param,
                f"{fmt.param} cannot be combined with constrained tool calls "
                "(tool_choice required/named, strict tools).",
            )
        if c.constrained:
            check_constrained_options(params)
        return c if len(choices) == 1 else Choices(ctx, req, choices)

    async def run(self, request, g):
        if isinstance(g, Choices):
            return await run_choices(self, request, g)
        return await super().run(request, g)

    async def prepare(self, c: Generation) -> None:
        assert isinstance(c, ChatCompletion)  # what accept() builds
        tokenizer, vocab_size = self.ctx.encoder.tokenizer, self.ctx.encoder.vocab_size
        if c.constrained_tools:
            c.generate.constraint = await asyncio.to_thread(
                tool_constraint,
                tokenizer,
                c.tools,
                c.req.tool_choice,
                start_in_reasoning=c.start_in_reasoning,
                vocab_size=vocab_size,
                parallel_tool_calls=c.parallel_tool_calls,
            )
        elif c.format is not None:
            c.generate.constraint = await asyncio.to_thread(
                format_constraint, tokenizer, c.format, start_in_reasoning=c.start_in_reasoning, vocab_size=vocab_size
            )

    def log_received(self, c: Generation) -> None:
        assert isinstance(c, ChatCompletion)  # what accept() builds
        log.info(
            "request %s received: prompt_tokens=%d max_tokens=%d stream=%s thinking=%s tools=%d constrained=%s",
            c.request_id,
            len(c.prompt_ids),
            c.generate.params.max_tokens,
            bool(c.req.stream),
            c.start_in_reasoning,
            len(c.tools),
            c.generate.constraint is not None,
        )
