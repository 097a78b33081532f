"""POST /tokenize and /detokenize, shaped as vLLM's.

    /tokenize   {"prompt" | "text", "add_special_tokens": true}
                or {"messages", "tools", "tool_choice", "chat_template_kwargs", ...} (chat)
                -> {"tokens": [...], "count": n, "max_model_len": m}
    /detokenize {"tokens": [...]} -> {"prompt": text}

add_special_tokens=true prepends BOS, exactly as /v1/completions does for a string prompt,
so `count` is the prompt_tokens a completion of the same text reports; the chat form's ids
are the ones /v1/chat/completions sends for the same fields (its prompt_tokens).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from dspark_loop.api.chat.completions import chat_prompt
from dspark_loop.api.chat.schemas import ChatCompletionRequest
from dspark_loop.api.context import ServingContext
from dspark_loop.api.errors import ApiError
from dspark_loop.api.limits import BIG_BODY_BYTES
from dspark_loop.api.schemas import DetokenizeRequest, TokenizeRequest, decode_body

CHAT_FIELDS = ("tools", "tool_choice", "chat_template_kwargs", "reasoning_effort", "thinking")


class TokenizeRoutes:
    def __init__(self, ctx: ServingContext):
        self.ctx = ctx

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.read()
        # NOTE: a long text is tokenised off the event loop, as the generation routes do
        if len(body) < BIG_BODY_BYTES:
            return web.json_response(self._tokenize(body))
        return web.json_response(await asyncio.to_thread(self._tokenize, body))

    def _tokenize(self, body: bytes) -> dict:
        req = decode_body(body, TokenizeRequest)
        self.ctx.check_model(req.model)
        given = [k for k in ("prompt", "text", "messages") if getattr(req, k) is not None]
        if len(given) > 1:
            raise ApiError(
                400, f"Send one of `prompt`, `text` and `messages`, not {' and '.join(given)}.", param=given[0]
            )
        if not given:
            raise ApiError(
                400, "Missing required parameter `prompt`.", param="prompt", code="missing_required_parameter"
            )
        chat = {k: getattr(req, k) for k in CHAT_FIELDS}
        if req.messages is None and any(v is not None for v in chat.values()):
            extra = next(k for k, v in chat.items() if v is not None)
            raise ApiError(400, f"`{extra}` goes with `messages` (the chat form).", param=extra)
        if req.messages is not None:
            _, ids = chat_prompt(self.ctx, ChatCompletionRequest(messages=req.messages, **chat))
        else:
            ids = self.ctx.encoder.encode_text(req.prompt or req.text or "", add_bos=req.add_special_tokens)
        out = {"tokens": ids, "count": len(ids), "max_model_len": self.ctx.max_model_len}
        if req.return_token_strs:
            tok = self.ctx.encoder.tokenizer
            out["token_strs"] = [tok.id_to_token(i) for i in ids]
        return out

    async def detokenize(self, request: web.Request) -> web.Response:
        req = decode_body(await request.read(), DetokenizeRequest)
        self.ctx.check_model(req.model)
        ids = self.ctx.encoder.check_ids(req.tokens, "tokens")
        return web.json_response({"prompt": self.ctx.encoder.decode(ids)})
