"""FakeEngine: the engine interface the API codes against, streaming scripted deltas.

By default each request gets max_tokens tokens of a fixed reply (one token per delta,
finish "length"). `script(g)` overrides the deltas; `hang=True` blocks forever after the
script (a request the client must abandon). It records every request and every generator
that was closed before its request finished (an abort).
"""

from __future__ import annotations

import asyncio
import functools

from dspark_loop.checkpoint.config import build_config, resolve_size
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput
from dspark_testing.tiny_tokenizer import tiny_tokenizer

REPLY = " the quick brown fox jumps over the lazy dog."


@functools.lru_cache(maxsize=1)
def tiny_model_config() -> ModelConfig:
    return ModelConfig.from_dict(build_config(resolve_size("tiny", {}), dtype="float32", w8a8=False, with_drafter=True))


def reply_ids() -> list[int]:
    return tiny_tokenizer().encode(REPLY, add_special_tokens=False).ids


def reply_deltas(g: GenerateRequest) -> list[RequestOutput]:
    """max_tokens tokens of REPLY (cycled), one per delta; the last says "length"."""
    tok, ids = tiny_tokenizer(), reply_ids()
    n = g.params.max_tokens
    outs = []
    for i in range(n):
        t = ids[i % len(ids)]
        outs.append(
            RequestOutput(
                g.request_id,
                [t],
                tok.decode([t]),
                finished=i == n - 1,
                finish_reason="length" if i == n - 1 else None,
                num_prompt_tokens=len(g.prompt_token_ids),
                num_output_tokens=i + 1,
            )
        )
    return outs


class FakeEngine:
    """An EngineClient (dspark_loop/engine/interfaces.py) with scripted deltas."""

    def __init__(
        self,
        *,
        max_model_len: int = 64,
        ready: bool = True,
        script=reply_deltas,
        hang: bool = False,
        delay_s: float = 0.0,
    ):
        self.max_model_len = max_model_len
        self.ready = ready
        self.dead_reason: str | None = None
        self.script = script
        self.hang = hang
        self.delay_s = delay_s
        self.num_running = 0
        self.num_waiting = 0
        self.requests: list[GenerateRequest] = []
        self.aborted: list[str] = []
        self.closed = asyncio.Event()  # set when any generator ends (finished or aborted)
        self.too_large: str | None = None
        self.restarting: str | None = None

    def capacity_problem(self, prompt_len: int, max_tokens: int) -> str | None:
        return self.too_large  # set by a test that wants the gate's 400

    def abort(self, request_id: str) -> bool:
        return False  # closing generate()'s iterator is how the API aborts

    def cache_stats(self) -> dict | None:
        return None

    def die(self, reason: str) -> None:
        self.dead_reason = reason
        self.ready = False

    async def generate(self, g: GenerateRequest):
        self.requests.append(g)
        self.num_running += 1
        finished = False
        try:
            for out in self.script(g):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                finished = out.finished
                yield out
                if finished:
                    return
            if self.hang:
                await asyncio.Event().wait()
        finally:
            self.num_running -= 1
            if not finished:
                self.aborted.append(g.request_id)
            self.closed.set()
