"""POST /v1/chat/completions: messages -> DeepSeek-V4 prompt -> engine -> OpenAI chat answer.

    validate (chat_validate, 400s) -> render (chat_render, BOS first, no special tokens
    added) -> [constraint for required/named/strict tools, built off the loop] ->
    engine.generate -> ChatOutput splits reasoning / content / tool_calls

Streaming, usage, finish reasons and engine failures follow /v1/completions (its
Completion and engine_failure are reused); chat adds the role chunk first and turns a
malformed tool block into an error (500, or in a stream an error event then [DONE]).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from aiohttp import web

from dspark_loop.api.chat_constraint import build_constraint, needs_constraint
from dspark_loop.api.chat_output import ChatOutput
from dspark_loop.api.chat_parse import ToolParseError
from dspark_loop.api.chat_render import THINK_START, chat_options, render_messages
from dspark_loop.api.chat_schemas import ChatCompletionRequest, as_completion_request
from dspark_loop.api.chat_validate import ChatRequestError, validate_chat_request
from dspark_loop.api.completions import BIG_BODY_BYTES, Completion, engine_failure
from dspark_loop.api.context import ServingContext
from dspark_loop.api.errors import ApiError, bad_request, unsupported
from dspark_loop.api.sampling import sampling_params
from dspark_loop.api.schemas import decode_body
from dspark_loop.api.sse import SSEStream
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput

log = logging.getLogger(__name__)
OK_REASONS = ("stop", "length")


def malformed_output(e: ToolParseError) -> ApiError:
    return ApiError(500, f"The model wrote a malformed tool call block: {e}",
                    code="malformed_tool_call")


class ChatCompletion(Completion):
    """One accepted chat request: the prompt, the output parser and the constraint's recipe."""

    def __init__(self, ctx: ServingContext, req: ChatCompletionRequest, prompt_ids: list[int],
                 prompt_text: str, generate: GenerateRequest, tools: list[dict]):
        super().__init__(ctx, req, prompt_ids, prompt_text, generate)
        self.tools = tools
        self.start_in_reasoning = prompt_text.endswith(THINK_START)
        self.parallel_tool_calls = req.parallel_tool_calls is not False
        self.output = ChatOutput(self.start_in_reasoning,
                                 parallel_tool_calls=self.parallel_tool_calls)

    @property
    def constrained(self) -> bool:
        return needs_constraint(self.tools, self.req.tool_choice)

    def envelope(self, choices: list[dict], chunk: bool = False) -> dict:
        return {"id": self.request_id, "object": "chat.completion.chunk" if chunk else "chat.completion",
                "created": self.created, "model": self.ctx.model_name, "choices": choices}

    def chunk(self, delta: dict, reason: str | None = None, stop_reason=None,
              continuous: bool = False) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        if reason is not None:
            choice["stop_reason"] = stop_reason
        body = self.envelope([choice], chunk=True)
        if continuous:
            body["usage"] = self.usage()
        return body


def check_chat_options(req: ChatCompletionRequest) -> None:
    if req.logprobs:
        raise unsupported("logprobs", "logprobs are not supported by this server.")
    if req.top_logprobs:
        raise unsupported("top_logprobs", "top_logprobs are not supported by this server.")
    if req.response_format is not None and req.response_format.get("type") != "text":
        raise unsupported("response_format", "response_format other than {\"type\": \"text\"} "
                                             "is not supported by this server.")
    if req.thinking is not None and req.thinking.get("type") not in ("enabled", "disabled"):
        raise bad_request('`thinking.type` must be "enabled" or "disabled".', "thinking.type")
    messages = req.messages
    if messages[-1].get("role") not in ("user", "tool"):
        raise bad_request("The last message must be from the user or a tool: the server "
                          "generates the next assistant turn (continuing an assistant or "
                          "system message is not supported).", f"messages[{len(messages) - 1}].role")


def declared_tools(req: ChatCompletionRequest) -> list[dict]:
    tools = list(req.tools or [])
    for msg in req.messages:
        if msg["role"] == "system" and msg.get("tools"):
            tools.extend(msg["tools"])
    return tools


class ChatCompletionsRoute:
    def __init__(self, ctx: ServingContext):
        self.ctx = ctx

    def accept(self, body: bytes) -> ChatCompletion:
        ctx = self.ctx
        req = decode_body(body, ChatCompletionRequest)
        ctx.check_model(req.model)
        ctx.check_ready()
        fields = req.format_fields()
        try:
            warnings = validate_chat_request(fields)
            thinking, effort = chat_options(fields)
        except ChatRequestError as e:
            raise bad_request(e.message, e.param) from None
        except ValueError as e:
            raise bad_request(str(e), "reasoning_effort") from None
        for w in warnings:
            log.debug("chat request: %s", w)
        check_chat_options(req)
        # NOTE: tool_choice "none" leaves the request's tools out of the prompt: the model
        # cannot call what it was not shown, and the answer is plain text as OpenAI promises.
        tools = None if req.tool_choice == "none" else req.tools
        prompt_text = render_messages(req.messages, tools=tools, thinking=thinking,
                                      reasoning_effort=effort)
        prompt_ids = ctx.encoder.encode_text(prompt_text, add_bos=False)
        try:
            ctx.check_context(len(prompt_ids))
        except ApiError as e:
            e.param = "messages"
            raise
        overrides = {}
        if req.max_tokens is None and req.max_completion_tokens is None:
            # chat's default length: the context left (unless --generate-config sets one)
            overrides["max_tokens"] = ctx.defaults.max_new_tokens or ctx.max_model_len - len(prompt_ids)
        params = sampling_params(as_completion_request(req, **overrides), ctx.defaults,
                                 ctx.encoder, len(prompt_ids), ctx.max_model_len)
        params = dataclasses.replace(params, skip_special_tokens=False)
        g = GenerateRequest(ctx.new_request_id("chatcmpl"), prompt_ids, params,
                            arrival_time=time.monotonic())
        c = ChatCompletion(ctx, req, prompt_ids, prompt_text, g,
                           [] if req.tool_choice == "none" else declared_tools(req))
        if c.constrained:
            # NOTE: the grammar ends with EOS; tokens forced past it would break the grammar.
            for name, value in (("ignore_eos", params.ignore_eos), ("min_tokens", params.min_tokens)):
                if value:
                    raise unsupported(name, f"{name} cannot be combined with constrained tool "
                                            "calls (tool_choice required/named, strict tools).")
        return c

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        c = self.accept(body) if len(body) < BIG_BODY_BYTES else await asyncio.to_thread(self.accept, body)
        if c.constrained:
            c.generate.constraint = await asyncio.to_thread(
                build_constraint, self.ctx.encoder.tokenizer, c.tools, c.req.tool_choice,
                start_in_reasoning=c.start_in_reasoning, vocab_size=self.ctx.encoder.vocab_size,
                parallel_tool_calls=c.parallel_tool_calls)
        log.info("request %s received: prompt_tokens=%d max_tokens=%d stream=%s thinking=%s "
                 "tools=%d constrained=%s", c.request_id, len(c.prompt_ids),
                 c.generate.params.max_tokens, bool(c.req.stream), c.start_in_reasoning,
                 len(c.tools), c.generate.constraint is not None)
        gen = self.ctx.engine.generate(c.generate)
        try:
            if c.req.stream:
                return await self._stream(request, c, gen)
            return await self._whole(c, gen)
        except asyncio.CancelledError:  # the client went away
            c.log_finished("client disconnected")
            raise
        finally:
            await gen.aclose()  # NOTE: aborts the request if it is still running

    # ---- one JSON answer --------------------------------------------------------------------
    async def _whole(self, c: ChatCompletion, gen) -> web.Response:
        token_ids: list[int] = []
        last: RequestOutput | None = None
        try:
            async for out in gen:
                token_ids.extend(out.new_token_ids)
                c.note(out, token_ids)
                last = out
                c.output.feed(out.new_text)
                if out.finished:
                    break
            reason = last.finish_reason if last is not None and last.finished else None
            if reason in OK_REASONS:
                c.output.finish()
        except ToolParseError as e:
            c.log_finished("malformed tool call")
            raise malformed_output(e) from None
        if reason not in OK_REASONS:
            c.log_finished(reason)
            raise engine_failure(self.ctx, last)
        reason = c.output.finish_reason(reason)
        c.log_finished(reason)
        self._log_truncation(c)
        choice = {"index": 0, "message": c.output.message(), "logprobs": None,
                  "finish_reason": reason, "stop_reason": last.stop_reason}
        return web.json_response({**c.envelope([choice]), "usage": c.usage()})

    # ---- server-sent events -----------------------------------------------------------------
    async def _stream(self, request: web.Request, c: ChatCompletion, gen) -> web.StreamResponse:
        opts = c.req.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts.continuous_usage_stats)
        first = await anext(gen, None)
        if first is None or (first.finished and first.finish_reason not in OK_REASONS
                             and not first.new_token_ids):
            c.log_finished(first.finish_reason if first else None)
            raise engine_failure(self.ctx, first)
        sse = SSEStream(request)
        await sse.start()
        reason = None
        try:
            await sse.send(c.chunk({"role": "assistant", "content": ""}, continuous=continuous))
            out, token_ids = first, []
            while out is not None:
                token_ids.extend(out.new_token_ids)
                c.note(out, token_ids)
                if out.finished and out.finish_reason not in OK_REASONS:
                    reason = out.finish_reason
                    await sse.send_error(engine_failure(self.ctx, out).body())
                    break
                try:
                    delta = c.output.feed(out.new_text)
                    tail = c.output.finish() if out.finished else None
                except ToolParseError as e:
                    reason = "malformed tool call"
                    await sse.send_error(malformed_output(e).body())
                    break
                if delta:
                    await sse.send(c.chunk(delta, continuous=continuous))
                if out.finished:
                    reason = c.output.finish_reason(out.finish_reason)
                    await sse.send(c.chunk(tail or {}, reason, out.stop_reason, continuous))
                    break
                out = await anext(gen, None)
            else:
                await sse.send_error(engine_failure(self.ctx, None).body())
            if include_usage:
                await sse.send({**c.envelope([], chunk=True), "usage": c.usage()})
            await sse.finish()
        except ConnectionResetError:
            reason = "client disconnected"
        self._log_truncation(c)
        c.log_finished(reason)
        return sse.response

    @staticmethod
    def _log_truncation(c: ChatCompletion) -> None:
        if c.output.truncated_calls:
            log.info("request %s: parallel_tool_calls=false dropped %d call(s)", c.request_id,
                     c.output.truncated_calls)
