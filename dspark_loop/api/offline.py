"""run_offline: --prompt mode. Every prompt is generated concurrently (one engine batch),
greedy, and each completion is printed in the order given; no HTTP server."""

from __future__ import annotations

import asyncio
import sys
import uuid

from dspark_loop.api.prompt import PromptEncoder
from dspark_loop.engine.interfaces import EngineClient
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput, SamplingParams


async def run_offline(
    engine: EngineClient,
    tokenizer,
    prompts: list[str],
    max_tokens: int,
    *,
    bos_token_id: int | None = None,
    stop: list[str] | None = None,
    ignore_eos: bool = False,
    out=None,
) -> list[str]:
    """Completions of `prompts` (BOS + text, as /v1/completions); raises ValueError for a
    prompt that does not fit the context and RuntimeError when the engine fails one."""
    out = out or sys.stdout
    encoder = PromptEncoder(tokenizer, bos_token_id, vocab_size=2**62)
    limit = engine.max_model_len
    requests = []
    for i, text in enumerate(prompts):
        ids = encoder.encode_text(text)
        if len(ids) >= limit:
            raise ValueError(f"--prompt #{i + 1} has {len(ids)} tokens; the context is {limit}")
        params = SamplingParams(
            max_tokens=min(max_tokens, limit - len(ids)), stop=list(stop or []), ignore_eos=ignore_eos
        )
        requests.append(GenerateRequest(f"offline-{uuid.uuid4().hex}", ids, params))
    texts = []
    for deltas in await generate_all(engine, requests):
        last = deltas[-1] if deltas else None
        if last is None or not last.finished or last.finish_reason not in ("stop", "length"):
            reason, error = (last.finish_reason, last.error) if last else (None, None)
            raise RuntimeError(f"generation failed ({reason}): {error}")
        texts.append("".join(d.new_text for d in deltas))
    for i, (prompt, text) in enumerate(zip(prompts, texts)):
        print(f"--- prompt {i + 1}: {prompt!r}\n{text}", file=out, flush=True)
    return list(texts)


async def generate_all(engine: EngineClient, requests: list[GenerateRequest]) -> list[list[RequestOutput]]:
    """Every request's deltas, generated concurrently (one engine batch), in request order."""
    return list(await asyncio.gather(*(collect(engine, g) for g in requests)))


async def collect(engine: EngineClient, g: GenerateRequest) -> list[RequestOutput]:
    """One request's deltas up to and including the finished one."""
    deltas = []
    gen = engine.generate(g)
    try:
        async for delta in gen:
            deltas.append(delta)
            if delta.finished:
                break
    finally:
        await gen.aclose()
    return deltas
