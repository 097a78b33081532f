"""POST /v1/completions: validate, tokenise, drive engine.generate(), answer as OpenAI does.

Everything about the request is checked before the engine sees it (400/404/503). A
stream waits for the first delta before sending headers, so a request the engine refuses
at once still gets a proper status; after that, failures travel as an SSE error event.
Leaving early (client gone, handler cancelled) closes the engine's generator, which aborts
the request and frees its pages.
"""
from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from dspark_loop.api.context import ServingContext
from dspark_loop.api.errors import ApiError
from dspark_loop.api.sampling import sampling_params
from dspark_loop.api.schemas import CompletionRequest, decode_body
from dspark_loop.api.sse import SSEStream
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput

log = logging.getLogger(__name__)
BIG_BODY_BYTES = 64 * 1024


class Completion:
    """One accepted request: what the response needs besides the engine's deltas."""

    def __init__(self, ctx: ServingContext, req: CompletionRequest, prompt_ids: list[int],
                 prompt_text: str | None, generate: GenerateRequest):
        self.ctx, self.req, self.generate = ctx, req, generate
        self.request_id = generate.request_id
        self.prompt_ids, self.prompt_text = prompt_ids, prompt_text
        self.created = int(time.time())
        self.start = time.monotonic()
        self.num_output_tokens = 0
        self.num_cached_tokens = 0

    @property
    def echo_text(self) -> str:
        if self.prompt_text is not None:
            return self.prompt_text
        return self.ctx.encoder.decode(self.prompt_ids)

    def note(self, out: RequestOutput, token_ids: list[int]) -> None:
        self.num_output_tokens = max(out.num_output_tokens, len(token_ids))
        self.num_cached_tokens = out.num_cached_tokens

    def usage(self) -> dict:
        n_prompt = len(self.prompt_ids)
        return {"prompt_tokens": n_prompt, "completion_tokens": self.num_output_tokens,
                "total_tokens": n_prompt + self.num_output_tokens,
                "prompt_tokens_details": {"cached_tokens": self.num_cached_tokens}}

    def envelope(self, choices: list[dict]) -> dict:
        return {"id": self.request_id, "object": "text_completion", "created": self.created,
                "model": self.ctx.model_name, "choices": choices}

    def log_finished(self, reason: str | None) -> None:
        elapsed = time.monotonic() - self.start
        log.info("request %s finished: reason=%s prompt_tokens=%d output_tokens=%d "
                 "latency=%.3fs tokens/s=%.1f", self.request_id, reason, len(self.prompt_ids),
                 self.num_output_tokens, elapsed, self.num_output_tokens / max(elapsed, 1e-9))


def engine_failure(ctx: ServingContext, out: RequestOutput | None) -> ApiError:
    """The request ended without a normal finish: 503 if the engine is gone, else 500."""
    if ctx.engine.dead_reason is not None:
        return ApiError(503, f"The engine is dead: {ctx.engine.dead_reason}", code="engine_dead")
    if out is not None and out.finish_reason == "abort":
        return ApiError(503, "The request was aborted by the server (shutting down?).",
                        code="request_aborted")
    message = (out.error if out is not None else None) or "the engine ended the request without a result"
    return ApiError(500, f"Generation failed: {message}", code="engine_error")


class CompletionsRoute:
    def __init__(self, ctx: ServingContext):
        self.ctx = ctx

    def accept(self, body: bytes) -> Completion:
        ctx = self.ctx
        req = decode_body(body, CompletionRequest)
        ctx.check_model(req.model)
        ctx.check_ready()
        prompt_ids, prompt_text = ctx.encoder.completion_prompt(req.prompt)
        ctx.check_context(len(prompt_ids))
        params = sampling_params(req, ctx.defaults, ctx.encoder, len(prompt_ids), ctx.max_model_len)
        g = GenerateRequest(ctx.new_request_id(), prompt_ids, params, arrival_time=time.monotonic())
        return Completion(ctx, req, prompt_ids, prompt_text, g)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        # NOTE: tokenising a long prompt takes milliseconds per 100 KB; off the event loop it
        # cannot stall the other requests' streams.
        c = self.accept(body) if len(body) < BIG_BODY_BYTES else await asyncio.to_thread(self.accept, body)
        log.info("request %s received: prompt_tokens=%d max_tokens=%d stream=%s", c.request_id,
                 len(c.prompt_ids), c.generate.params.max_tokens, bool(c.req.stream))
        gen = self.ctx.engine.generate(c.generate)
        try:
            if c.req.stream:
                return await self._stream(request, c, gen)
            return await self._whole(c, gen)
        except asyncio.CancelledError:  # the client went away (aiohttp handler_cancellation)
            c.log_finished("client disconnected")
            raise
        finally:
            await gen.aclose()  # NOTE: aborts the request if it is still running

    # ---- one JSON answer --------------------------------------------------------------------
    async def _whole(self, c: Completion, gen) -> web.Response:
        texts: list[str] = []
        token_ids: list[int] = []
        last: RequestOutput | None = None
        async for out in gen:
            texts.append(out.new_text)
            token_ids.extend(out.new_token_ids)
            c.note(out, token_ids)
            last = out
            if out.finished:
                break
        reason = last.finish_reason if last is not None and last.finished else None
        c.log_finished(reason)
        if reason not in ("stop", "length"):
            raise engine_failure(self.ctx, last)
        text = "".join(texts)
        choice = {"index": 0, "text": c.echo_text + text if c.req.echo else text,
                  "logprobs": None, "finish_reason": reason, "stop_reason": last.stop_reason}
        if c.req.return_token_ids:
            choice["prompt_token_ids"] = c.prompt_ids
            choice["token_ids"] = token_ids
        return web.json_response({**c.envelope([choice]), "usage": c.usage()})

    # ---- server-sent events -----------------------------------------------------------------
    async def _stream(self, request: web.Request, c: Completion, gen) -> web.StreamResponse:
        opts = c.req.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts.continuous_usage_stats)
        first = await anext(gen, None)
        if first is None or (first.finished and first.finish_reason not in ("stop", "length")
                             and not first.new_token_ids):
            c.log_finished(first.finish_reason if first else None)
            raise engine_failure(self.ctx, first)
        sse = SSEStream(request)
        await sse.start()
        reason = None
        try:
            if c.req.echo:
                await sse.send(self._chunk(c, c.echo_text, None, None, [], True, continuous))
            out, token_ids, first_chunk = first, [], not c.req.echo
            while out is not None:
                token_ids.extend(out.new_token_ids)
                c.note(out, token_ids)
                if out.finished and out.finish_reason not in ("stop", "length"):
                    reason = out.finish_reason
                    await sse.send_error(engine_failure(self.ctx, out).body())
                    break
                if out.new_text or out.finished or (c.req.return_token_ids and out.new_token_ids):
                    reason = out.finish_reason if out.finished else None
                    await sse.send(self._chunk(c, out.new_text, reason, out.stop_reason,
                                               out.new_token_ids, first_chunk, continuous))
                    first_chunk = False
                if out.finished:
                    break
                out = await anext(gen, None)
            else:
                await sse.send_error(engine_failure(self.ctx, None).body())
            if include_usage:
                await sse.send({**c.envelope([]), "usage": c.usage()})
            await sse.finish()
        except ConnectionResetError:
            reason = "client disconnected"
        c.log_finished(reason)
        return sse.response

    def _chunk(self, c: Completion, text: str, reason: str | None, stop_reason, token_ids: list[int],
               first: bool, continuous: bool) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                  "stop_reason": stop_reason}
        if c.req.return_token_ids:
            if first:
                choice["prompt_token_ids"] = c.prompt_ids
            choice["token_ids"] = list(token_ids)
        chunk = c.envelope([choice])
        if continuous:
            chunk["usage"] = c.usage()
        return chunk
