"""Several choices in one answer: a batch of prompts and/or n > 1 (/v1/completions), n > 1
(/v1/chat/completions).

Each choice is its own engine request (a Completion with its index); they run concurrently
and the answer merges them: one JSON body with the choices in index order, or one SSE stream
whose chunks carry each choice's index as its deltas arrive. Usage counts every prompt once
and every choice's tokens. A choice that fails ends the whole answer (its error), and the
others are aborted (their generators are closed).
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from dspark_loop.api.generation.skeleton import OK_REASONS, OutputError, engine_failure, speculation_extras
from dspark_loop.api.sse import SSEStream

log = logging.getLogger(__name__)


class Choices:
    def __init__(self, ctx, req, choices: list) -> None:
        self.ctx, self.req, self.choices = ctx, req, choices
        self.request_id = choices[0].request_id
        for c in choices:
            c.request_id = self.request_id  # one answer id for every chunk
            c.usage = self.usage  # running usage in chunks is the whole answer's
            c.finished_ok = False

    def usage(self) -> dict:
        prompts = {c.index // (self.req.n or 1): len(c.prompt_ids) for c in self.choices}
        n_prompt = sum(prompts.values())
        n_out = sum(c.num_output_tokens for c in self.choices)
        cached = sum(c.num_cached_tokens for c in self.choices)
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_out,
            "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def extras(self) -> dict:
        return speculation_extras(self.req, [c.spec_stats for c in self.choices])


async def _collect(ctx, c) -> dict:
    gen = ctx.engine.generate(c.generate)
    try:
        token_ids, last = [], None
        try:
            async for out in gen:
                token_ids.extend(out.new_token_ids)
                c.note(out, token_ids)
                c.feed(out.new_text)
                last = out
                if out.finished:
                    break
            reason = last.finish_reason if last is not None and last.finished else None
            if reason not in OK_REASONS:
                raise engine_failure(ctx, last)
            c.finish_output()
        except OutputError as e:
            raise e.api_error from None
        return c.whole_choice(reason, last, token_ids)[0]
    finally:
        await gen.aclose()


async def _whole(ctx, cs: Choices) -> web.Response:
    tasks = [asyncio.ensure_future(_collect(ctx, c)) for c in cs.choices]
    try:
        choices = await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()  # NOTE: one failed: abort the others (a no-op for finished tasks)
    head = cs.choices[0]
    body = {**head.envelope(sorted(choices, key=lambda ch: ch["index"])), "usage": cs.usage(), **cs.extras()}
    return web.json_response(body)


async def _stream(ctx, request: web.Request, cs: Choices) -> web.StreamResponse:
    opts = cs.req.stream_options
    include_usage = bool(opts and opts.include_usage)
    continuous = include_usage and bool(opts.continuous_usage_stats)
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(c) -> None:
        gen = ctx.engine.generate(c.generate)
        try:
            while (out := await anext(gen, None)) is not None:
                await queue.put((c, out))
                if out.finished:
                    break
        finally:
            await gen.aclose()
            await queue.put((c, None))

    tasks = [asyncio.ensure_future(pump(c)) for c in cs.choices]
    sse = None
    try:
        c, out = await queue.get()
        if out is None or (out.finished and out.finish_reason not in OK_REASONS and not out.new_token_ids):
            raise engine_failure(ctx, out)
        sse = SSEStream(request)
        await sse.start()
        for ch in cs.choices:
            for event in ch.opening_chunks(continuous):
                if not sse.write_now(event):
                    await sse.write(event)
        token_ids: dict[int, list[int]] = {id(ch): [] for ch in cs.choices}
        done = 0
        while True:
            if out is None:
                if not c.finished_ok:
                    await sse.send_error(engine_failure(ctx, None).body())
                    break
                done += 1
                if done == len(cs.choices):
                    break
            else:
                token_ids[id(c)].extend(out.new_token_ids)
                c.note(out, token_ids[id(c)])
                if out.finished and out.finish_reason not in OK_REASONS:
                    await sse.send_error(engine_failure(ctx, out).body())
                    break
                try:
                    events, _ = c.delta_chunks(out, continuous)
                except OutputError as e:
                    await sse.send_error(e.api_error.body())
                    break
                for event in events:
                    if not sse.write_now(event):
                        await sse.write(event)
                c.finished_ok = out.finished
            c, out = await queue.get()
        extras = cs.extras()
        if include_usage or extras:
            usage = {"usage": cs.usage()} if include_usage else {}
            await sse.send({**cs.choices[0].envelope([], chunk=True), **usage, **extras})
        await sse.finish()
    except ConnectionResetError:
        log.info("request %s: client disconnected", cs.request_id)
    finally:
        for t in tasks:
            t.cancel()
    assert sse is not None  # every path that did not raise opened the stream
    return sse.response


async def run_choices(route, request: web.Request, cs: Choices) -> web.StreamResponse:
    route.ctx.engine.check_choices(len(cs.choices), "n" if (cs.req.n or 1) > 1 else "prompt")
    for c in cs.choices:
        await route.prepare(c)  # a constrained chat request's grammar, per choice
    log.info(
        "request %s received: %d choices, max_tokens=%d stream=%s",
        cs.request_id,
        len(cs.choices),
        cs.choices[0].generate.params.max_tokens,
        bool(cs.req.stream),
    )
    start, outcome = time.monotonic(), "failed"
    try:
        answer = await (_stream(route.ctx, request, cs) if cs.req.stream else _whole(route.ctx, cs))
        outcome = "answered"
        return answer
    except asyncio.CancelledError:  # the client went away (aiohttp handler_cancellation)
        outcome = "client disconnected"
        raise
    finally:
        log.info(
            "request %s finished: %s, %d choices, output_tokens=%d latency=%.3fs",
            cs.request_id,
            outcome,
            len(cs.choices),
            sum(c.num_output_tokens for c in cs.choices),
            time.monotonic() - start,
        )
