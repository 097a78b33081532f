"""POST /tokenize and /detokenize, shaped as vLLM's.

    /tokenize   {"prompt" | "text", "add_special_tokens": true}
                -> {"tokens": [...], "count": n, "max_model_len": m}
    /detokenize {"tokens": [...]} -> {"prompt": text}

add_special_tokens=true prepends BOS, exactly as /v1/completions does for a string prompt,
so `count` is the prompt_tokens a completion of the same text reports.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from dspark_loop.api.context import ServingContext
from dspark_loop.api.errors import ApiError
from dspark_loop.api.limits import BIG_BODY_BYTES
from dspark_loop.api.schemas import DetokenizeRequest, TokenizeRequest, decode_body


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
        if req.prompt is not None and req.text is not None:
            raise ApiError(400, "Send `prompt` or `text`, not both.", param="prompt")
        text = req.prompt if req.prompt is not None else req.text
        if text is None:
            raise ApiError(
                400, "Missing required parameter `prompt`.", param="prompt", code="missing_required_parameter"
            )
        ids = self.ctx.encoder.encode_text(text, add_bos=req.add_special_tokens)
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
