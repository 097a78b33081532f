"""POST /v1/completions: validate, tokenise, generate, answer as OpenAI does (the shared
accept/whole/stream skeleton is generation.py; several choices: completion_choices.py).

One prompt and n = 1 is one Completion. A batch of prompts (a list of strings or of id
lists) and/or n > 1 gives one engine request per (prompt i, choice j), answered as choice
index i * n + j, as vLLM does; the n choices of a prompt share its seed and differ by their
choice index (their own noise). NOTE: siblings admitted in one step each prefill the prompt
(pages enter the prefix cache only once computed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time

from dspark_loop.api.context import ServingContext
from dspark_loop.api.errors import bad_request
from dspark_loop.api.generation.choices import Choices, run_choices
from dspark_loop.api.generation.logprobs_format import LogprobsFormatter
from dspark_loop.api.generation.sampling import check_completion_options, sampling_params
from dspark_loop.api.generation.skeleton import Generation, GenerationRoute
from dspark_loop.api.schemas import CompletionRequest
from dspark_loop.api.sse import encode_json
from dspark_loop.api.structured.output_format import OutputFormat, check_constrained_options, output_format
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput, TokenLogprob

MAX_CHOICES = 1024  # engine requests one /v1/completions request may start


class Completion(Generation):
    req: CompletionRequest

    def __init__(
        self,
        ctx: ServingContext,
        req: CompletionRequest,
        prompt_ids: list[int],
        prompt_text: str | None,
        generate: GenerateRequest,
        index: int = 0,
    ):
        super().__init__(ctx, req, prompt_ids, generate)
        self.prompt_text = prompt_text
        self.index = index
        self.texts: list[str] = []
        self.first_chunk = True  # the first chunk carries prompt_token_ids (and the echo)
        self.logprobs: list[TokenLogprob] = []  # the answer's entries (echoed prompt first)
        self.sent = 0  # entries already answered
        self.text_offset = 0  # logprobs' text_offset of the next entry
        self.formatter = LogprobsFormatter(lambda t: ctx.encoder.decode([t]))
        self.format: OutputFormat | None = None  # OutputFormat: response_format / structured_outputs (None: free text)

    @property
    def wants_logprobs(self) -> bool:
        return self.req.logprobs is not None

    @property
    def echo_text(self) -> str:
        if self.prompt_text is not None:
            return self.prompt_text
        return self.ctx.encoder.decode(self.prompt_ids)

    def feed(self, text: str) -> None:
        self.texts.append(text)

    def note(self, out: RequestOutput, token_ids: list[int]) -> None:
        super().note(out, token_ids)
        if out.prompt_logprobs is not None and self.req.echo:
            self.logprobs += out.prompt_logprobs
        self.logprobs += out.logprobs or []

    def take_logprobs(self, end: int) -> dict | None:
        """The entries not sent yet up to `end`, formatted (text offsets run on)."""
        if not self.wants_logprobs:
            return None
        entries = self.logprobs[self.sent : end]
        in_text = [self._in_text(self.sent + i, e.token_id) for i, e in enumerate(entries)]
        out, self.text_offset = self.formatter.completion(entries, self.text_offset, in_text)
        self.sent = end
        return out

    def _in_text(self, k: int, token_id: int) -> bool:
        """Whether the answer's text spells entry k (the echoed prompt's entries first): not
        the BOS the server prepended to a text prompt, nor a special token the output skips."""
        echoed = len(self.prompt_ids) if self.req.echo else 0
        if k < echoed:
            return not (k == 0 and self.prompt_text is not None and token_id == self.ctx.encoder.bos_token_id)
        return not (self.generate.params.skip_special_tokens and token_id in self.ctx.encoder.special_ids)

    def whole_choice(self, reason: str, last: RequestOutput, token_ids: list[int]) -> tuple[dict, str]:
        text = "".join(self.texts)
        choice = {
            "index": self.index,
            "text": self.echo_text + text if self.req.echo else text,
            "logprobs": self.take_logprobs(len(self.logprobs)),
            "finish_reason": reason,
            "stop_reason": last.stop_reason,
        }
        if self.req.return_token_ids:
            choice["prompt_token_ids"] = self.prompt_ids
            choice["token_ids"] = token_ids
        return choice, reason

    def delta_chunks(self, out: RequestOutput, continuous: bool) -> tuple[list[bytes], str | None]:
        if self.pre_encoded and not (self.first_chunk or continuous or self.wants_logprobs):
            events = self.plain_events(out)
            if events is not None:
                return events, None
        reason = out.finish_reason if out.finished else None
        chunks = []
        if self.first_chunk and self.req.echo:
            # NOTE: the echo goes out with the first delta, which brings the prompt's logprobs
            num_prompt = len(out.prompt_logprobs or []) if self.wants_logprobs else 0
            chunks.append(self.chunk(self.echo_text, None, None, [], True, continuous, self.take_logprobs(num_prompt)))
            self.first_chunk = False
        if (
            out.new_text
            or out.finished
            or (self.req.return_token_ids and out.new_token_ids)
            or (self.wants_logprobs and out.new_token_ids)
        ):
            chunks.append(
                self.chunk(
                    out.new_text,
                    reason,
                    out.stop_reason,
                    out.new_token_ids,
                    self.first_chunk,
                    continuous,
                    self.take_logprobs(len(self.logprobs)),
                )
            )
            self.first_chunk = False
        return chunks, reason

    def chunk(
        self,
        text: str,
        reason: str | None,
        stop_reason,
        token_ids: list[int],
        first: bool,
        continuous: bool,
        logprobs: dict | None = None,
    ) -> bytes:
        choice = {
            "index": self.index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": reason,
            "stop_reason": stop_reason,
        }
        if self.req.return_token_ids:
            if first:
                choice["prompt_token_ids"] = self.prompt_ids
            choice["token_ids"] = list(token_ids)
        return self.chunk_event(choice, continuous)

    def plain_events(self, out: RequestOutput) -> list[bytes] | None:
        """NOTE: most chunks carry text (and token ids) and nothing else: pre-split bytes
        around them, no dict (None: not such a chunk, build it whole)."""
        if out.finished or out.stop_reason is not None:
            return None
        text, ids = out.new_text, out.new_token_ids
        if not self.req.return_token_ids:
            return [b"".join((self.plain_head, encode_json(text), self.plain_tail))] if text else []
        if not ids:
            return None
        return [b"".join((self.plain_head, encode_json(text), self.plain_ids, encode_json(ids), b"}]}\n\n"))]

    # the bytes around a plain chunk's text (and token ids): chunk_event's for
    # {"index": i, "text": t, "logprobs": None, "finish_reason": None, "stop_reason": None(, "token_ids": ids)}
    @functools.cached_property
    def plain_head(self) -> bytes:
        return self.chunk_head + b'[{"index":%d,"text":' % self.index

    plain_tail = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
    plain_ids = b',"logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":'


class CompletionsRoute(GenerationRoute):
    def accept(self, body: bytes):
        ctx = self.ctx
        req = self.decode(body, CompletionRequest)
        prompts = ctx.encoder.completion_prompts(req.prompt, ctx.max_model_len)
        for ids, _ in prompts:
            ctx.check_context(len(ids))
        check_completion_options(req)
        fmt = output_format(req.response_format, req.structured_outputs)
        if len(prompts) * (req.n or 1) > MAX_CHOICES:
            raise bad_request(
                f"{len(prompts)} prompts x n {req.n or 1} make more than {MAX_CHOICES} "
                f"choices in one request; split the batch.",
                "prompt",
            )
        choices = []
        for i, (ids, text) in enumerate(prompts):
            params = sampling_params(
                req, ctx.defaults, ctx.encoder, len(ids), ctx.max_model_len, sampling_defaults=ctx.sampling_defaults
            )
            if fmt is not None:
                check_constrained_options(params)
            n = req.n or 1
            for j in range(n):
                g = GenerateRequest(
                    ctx.new_request_id(), ids, dataclasses.replace(params, choice=j), arrival_time=time.monotonic()
                )
                choices.append(Completion(ctx, req, ids, text, g, index=i * n + j))
                choices[-1].format = fmt
        return choices[0] if len(choices) == 1 else Choices(ctx, req, choices)

    async def run(self, request, g):
        if isinstance(g, Choices):
            return await run_choices(self, request, g)
        return await super().run(request, g)

    async def prepare(self, c: Generation) -> None:
        assert isinstance(c, Completion)  # what accept() builds
        if c.format is not None:  # response_format / structured_outputs: a JSON grammar
            from dspark_loop.api.structured.build import format_constraint

            c.generate.constraint = await asyncio.to_thread(
                format_constraint,
                self.ctx.encoder.tokenizer,
                c.format,
                start_in_reasoning=False,
                vocab_size=self.ctx.encoder.vocab_size,
            )
