"""POST /v1/completions: validate, tokenise, generate, answer as OpenAI does (the shared
accept/whole/stream skeleton is generation.py)."""
from __future__ import annotations

import time

from dspark_loop.api.context import ServingContext
from dspark_loop.api.generation import Generation, GenerationRoute
from dspark_loop.api.sampling import check_completion_options, sampling_params
from dspark_loop.api.schemas import CompletionRequest
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput


class Completion(Generation):
    req: CompletionRequest

    def __init__(self, ctx: ServingContext, req: CompletionRequest, prompt_ids: list[int],
                 prompt_text: str | None, generate: GenerateRequest):
        super().__init__(ctx, req, prompt_ids, generate)
        self.prompt_text = prompt_text
        self.texts: list[str] = []
        self.first_chunk = not req.echo  # the first chunk carries prompt_token_ids

    @property
    def echo_text(self) -> str:
        if self.prompt_text is not None:
            return self.prompt_text
        return self.ctx.encoder.decode(self.prompt_ids)

    def feed(self, text: str) -> None:
        self.texts.append(text)

    def whole_choice(self, reason: str, last: RequestOutput, token_ids: list[int]) -> tuple[dict, str]:
        text = "".join(self.texts)
        choice = {"index": 0, "text": self.echo_text + text if self.req.echo else text,
                  "logprobs": None, "finish_reason": reason, "stop_reason": last.stop_reason}
        if self.req.return_token_ids:
            choice["prompt_token_ids"] = self.prompt_ids
            choice["token_ids"] = token_ids
        return choice, reason

    def opening_chunks(self, continuous: bool) -> list[dict]:
        if not self.req.echo:
            return []
        return [self.chunk(self.echo_text, None, None, [], True, continuous)]

    def delta_chunks(self, out: RequestOutput, continuous: bool) -> tuple[list[dict], str | None]:
        reason = out.finish_reason if out.finished else None
        if not (out.new_text or out.finished or (self.req.return_token_ids and out.new_token_ids)):
            return [], reason
        chunk = self.chunk(out.new_text, reason, out.stop_reason, out.new_token_ids,
                           self.first_chunk, continuous)
        self.first_chunk = False
        return [chunk], reason

    def chunk(self, text: str, reason: str | None, stop_reason, token_ids: list[int],
              first: bool, continuous: bool) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                  "stop_reason": stop_reason}
        if self.req.return_token_ids:
            if first:
                choice["prompt_token_ids"] = self.prompt_ids
            choice["token_ids"] = list(token_ids)
        return self.chunk_body(choice, continuous)


class CompletionsRoute(GenerationRoute):
    def accept(self, body: bytes) -> Completion:
        ctx = self.ctx
        req = self.decode(body, CompletionRequest)
        prompt_ids, prompt_text = ctx.encoder.completion_prompt(req.prompt)
        ctx.check_context(len(prompt_ids))
        params = sampling_params(req, ctx.defaults, ctx.encoder, len(prompt_ids), ctx.max_model_len)
        check_completion_options(req)
        g = GenerateRequest(ctx.new_request_id(), prompt_ids, params, arrival_time=time.monotonic())
        return Completion(ctx, req, prompt_ids, prompt_text, g)
