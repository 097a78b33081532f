"""The skeleton /v1/completions and /v1/chat/completions share: accept a body, drive
engine.generate(), answer with one JSON body or a server-sent event stream.

    GenerationRoute.handle:  accept(body) -> prepare(c) -> engine.generate(c.generate)
                             -> whole(): every delta, then c.whole_choice()
                             -> stream(): c.opening_chunks(), c.delta_chunks(out) per delta
    Generation (per request, a route subclasses it): usage, envelope, the hooks above.

Everything about the request is checked before the engine sees it (400/404/503). A stream
waits for the first delta before sending headers, so a request the engine refuses at once
still gets a proper status; after that, failures travel as an SSE error event. Leaving
early (client gone, handler cancelled) closes the engine's generator, which aborts the
request and frees its pages.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from aiohttp import web

from dspark_loop.api.context import ServingContext
from dspark_loop.api.errors import ApiError
from dspark_loop.api.limits import BIG_BODY_BYTES
from dspark_loop.api.schemas import GenerationFields, decode_body
from dspark_loop.api.sse import SSEStream, encode_json, frame
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput

log = logging.getLogger(__name__)
OK_REASONS = ("stop", "length")


class OutputError(Exception):
    """The model's output cannot be answered (a malformed tool block): api_error is sent,
    log_reason is what the request log says."""

    def __init__(self, api_error: ApiError, log_reason: str):
        super().__init__(api_error.message)
        self.api_error, self.log_reason = api_error, log_reason


def engine_failure(ctx: ServingContext, out: RequestOutput | None) -> ApiError:
    """The request ended without a normal finish: 503 if the engine is gone, else 500."""
    if ctx.engine.dead_reason is not None:
        return ApiError(503, f"The engine is dead: {ctx.engine.dead_reason}", code="engine_dead")
    if out is not None and out.finish_reason == "abort":
        return ApiError(503, "The request was aborted by the server (shutting down?).", code="request_aborted")
    message = (out.error if out is not None else None) or "the engine ended the request without a result"
    return ApiError(500, f"Generation failed: {message}", code="engine_error")


class Generation:
    """One accepted request: what the response needs besides the engine's deltas."""

    object_name = "text_completion"
    chunk_object_name = "text_completion"
    pre_encoded = True  # False: every chunk a dict encoded whole (the reference the tests compare with)

    def __init__(self, ctx: ServingContext, req: GenerationFields, prompt_ids: list[int], generate: GenerateRequest):
        self.ctx, self.req, self.generate = ctx, req, generate
        self.request_id = generate.request_id
        self.prompt_ids = prompt_ids
        self.created = int(time.time())
        self.start = time.monotonic()
        self.num_output_tokens = 0
        self.num_cached_tokens = 0
        self.spec_stats = (0, 0, 0)  # (proposed, accepted, verify steps), from the last delta

    def note(self, out: RequestOutput, token_ids: list[int]) -> None:
        self.num_output_tokens = max(out.num_output_tokens, len(token_ids))
        self.num_cached_tokens = out.num_cached_tokens
        if out.speculation is not None:
            self.spec_stats = out.speculation

    def extras(self) -> dict:
        """Top-level fields of the final body / usage chunk beyond usage: the request's
        speculation figures when it asked (`"speculation": {"return_stats": true}`)."""
        return speculation_extras(self.req, [self.spec_stats])

    def usage(self) -> dict:
        n_prompt = len(self.prompt_ids)
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": self.num_output_tokens,
            "total_tokens": n_prompt + self.num_output_tokens,
            "prompt_tokens_details": {"cached_tokens": self.num_cached_tokens},
        }

    def envelope(self, choices: list[dict], chunk: bool = False) -> dict:
        return {
            "id": self.request_id,
            "object": self.chunk_object_name if chunk else self.object_name,
            "created": self.created,
            "model": self.ctx.model_name,
            "choices": choices,
        }

    @functools.cached_property
    def chunk_head(self) -> bytes:
        """The start of every chunk event of this stream, encoded once (the request's id is
        final by the first chunk): b'data: {"id":..,"object":..,"created":..,"model":..,"choices":'."""
        empty = encode_json(self.envelope([], chunk=True))
        assert empty.endswith(b'"choices":[]}')
        return b"data: " + empty[: -len(b"[]}")]

    def chunk_event(self, choice: dict, continuous: bool) -> bytes:
        """One SSE chunk event holding choice (with running usage when asked): the bytes of
        sse.frame({**envelope([choice], chunk=True), "usage": usage()}), the envelope
        encoded once per stream (chunk_head) instead of once per chunk."""
        if not self.pre_encoded:
            return frame({**self.envelope([choice], chunk=True), **({"usage": self.usage()} if continuous else {})})
        if continuous:
            return b"".join((self.chunk_head, encode_json([choice]), b',"usage":', encode_json(self.usage()), b"}\n\n"))
        return b"".join((self.chunk_head, encode_json([choice]), b"}\n\n"))

    def log_finished(self, reason: str | None) -> None:
        elapsed = time.monotonic() - self.start
        log.info(
            "request %s finished: reason=%s prompt_tokens=%d output_tokens=%d latency=%.3fs tokens/s=%.1f",
            self.request_id,
            reason,
            len(self.prompt_ids),
            self.num_output_tokens,
            elapsed,
            self.num_output_tokens / max(elapsed, 1e-9),
        )

    # ---- hooks a route's Generation fills in ---------------------------------------------------
    def feed(self, text: str) -> None:
        """A non-stream answer's next text (may raise OutputError)."""
        raise NotImplementedError

    def finish_output(self) -> None:
        """A non-stream answer ended with stop/length (may raise OutputError)."""

    def whole_choice(self, reason: str, last: RequestOutput, token_ids: list[int]) -> tuple[dict, str]:
        """(choices[0] of the JSON answer, the finish reason it reports)."""
        raise NotImplementedError

    def opening_chunks(self, continuous: bool) -> list[bytes]:
        """Chunk events (chunk_event) sent before the first delta's."""
        return []

    def delta_chunks(self, out: RequestOutput, continuous: bool) -> tuple[list[bytes], str | None]:
        """(chunk events to send for one delta, the finish reason once finished; may raise OutputError)."""
        raise NotImplementedError


def speculation_extras(req: GenerationFields, stats: list[tuple[int, int, int]]) -> dict:
    """{"speculation": totals over the choices' stats} when the request asked, else {}.
    stats: the engine's (proposed, accepted, verify steps), accepted counting each verify's
    bonus token. NOTE: answered as drafts accepted (of those proposed), as vLLM's
    spec_decode_num_accepted_tokens counts them: with the bonus a user read 62 accepted of
    53 proposed."""
    if req.speculation is None or not req.speculation.return_stats:
        return {}
    proposed, accepted, steps = (sum(col) for col in zip(*stats))
    return {"speculation": {"proposed": proposed, "accepted": accepted - steps, "verify_steps": steps}}


class GenerationRoute:
    """A POST route that generates: subclasses say accept(body) and, optionally, prepare()."""

    def __init__(self, ctx: ServingContext):
        self.ctx = ctx

    def accept(self, body: bytes) -> Generation:
        raise NotImplementedError

    def decode(self, body: bytes, kind: type):
        """The body as `kind`, for a served model, while the engine is ready (else 4xx/503)."""
        req = decode_body(body, kind)
        self.ctx.check_model(req.model)
        self.ctx.check_ready()
        return req

    async def prepare(self, g: Generation) -> None:
        """Work after accept that must not block the loop (a tool-call constraint)."""

    def log_received(self, g: Generation) -> None:
        log.info(
            "request %s received: prompt_tokens=%d max_tokens=%d stream=%s",
            g.request_id,
            len(g.prompt_ids),
            g.generate.params.max_tokens,
            bool(g.req.stream),
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        # NOTE: tokenising a long prompt takes milliseconds per 100 KB; off the event loop it
        # cannot stall the other requests' streams.
        g = self.accept(body) if len(body) < BIG_BODY_BYTES else await asyncio.to_thread(self.accept, body)
        return await self.run(request, g)

    async def run(self, request: web.Request, g: Generation) -> web.StreamResponse:
        """Generate for one accepted request and answer it (whole or streamed)."""
        await self.prepare(g)
        self.log_received(g)
        gen = self.ctx.engine.generate(g.generate)
        try:
            if g.req.stream:
                return await self.stream(request, g, gen)
            return await self.whole(g, gen)
        except asyncio.CancelledError:  # the client went away (aiohttp handler_cancellation)
            g.log_finished("client disconnected")
            raise
        finally:
            await gen.aclose()  # NOTE: aborts the request if it is still running

    # ---- one JSON answer --------------------------------------------------------------------
    async def whole(self, g: Generation, gen) -> web.Response:
        token_ids: list[int] = []
        last: RequestOutput | None = None
        try:
            async for out in gen:
                token_ids.extend(out.new_token_ids)
                g.note(out, token_ids)
                last = out
                g.feed(out.new_text)
                if out.finished:
                    break
            reason = last.finish_reason if last is not None and last.finished else None
            if reason in OK_REASONS:
                g.finish_output()
        except OutputError as e:
            g.log_finished(e.log_reason)
            raise e.api_error from None
        if reason not in OK_REASONS:
            g.log_finished(reason)
            raise engine_failure(self.ctx, last)
        assert last is not None  # an OK reason came with the last output
        choice, reason = g.whole_choice(reason, last, token_ids)
        g.log_finished(reason)
        return web.json_response({**g.envelope([choice]), "usage": g.usage(), **g.extras()})

    # ---- server-sent events -----------------------------------------------------------------
    async def stream(self, request: web.Request, g: Generation, gen) -> web.StreamResponse:
        opts = g.req.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = bool(opts and opts.include_usage and opts.continuous_usage_stats)
        first = await anext(gen, None)
        if first is None or (first.finished and first.finish_reason not in OK_REASONS and not first.new_token_ids):
            g.log_finished(first.finish_reason if first else None)
            raise engine_failure(self.ctx, first)
        sse = SSEStream(request)
        await sse.start()
        reason = None
        try:
            for event in g.opening_chunks(continuous):
                if not sse.write_now(event):
                    await sse.write(event)
            out, token_ids = first, []
            while out is not None:
                token_ids.extend(out.new_token_ids)
                g.note(out, token_ids)
                if out.finished and out.finish_reason not in OK_REASONS:
                    reason = out.finish_reason
                    await sse.send_error(engine_failure(self.ctx, out).body())
                    break
                try:
                    events, reason = g.delta_chunks(out, continuous)
                except OutputError as e:
                    reason = e.log_reason
                    await sse.send_error(e.api_error.body())
                    break
                for event in events:  # NOTE: write_now inlined first: every stream, every step
                    if not sse.write_now(event):
                        await sse.write(event)
                if out.finished:
                    break
                out = await anext(gen, None)
            else:
                await sse.send_error(engine_failure(self.ctx, None).body())
            extras = g.extras()
            if include_usage or extras:
                usage = {"usage": g.usage()} if include_usage else {}
                await sse.send({**g.envelope([], chunk=True), **usage, **extras})
            await sse.finish()
        except ConnectionResetError:
            reason = "client disconnected"
        g.log_finished(reason)
        return sse.response
