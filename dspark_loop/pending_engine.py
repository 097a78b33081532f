"""PendingEngine: the engine the HTTP app is given at once, before the ranks are up."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput


class PendingEngine:
    """Stands in for the EngineLoop until the ranks are up (then delegates to it); an
    EngineClient (engine/interfaces.py)."""

    def __init__(self, max_model_len: int) -> None:
        self.inner: EngineLoop | None = None
        self.start_error: str | None = None
        self._max_model_len = max_model_len

    @property
    def ready(self) -> bool:
        return self.inner is not None and self.inner.ready

    @property
    def dead_reason(self) -> str | None:
        return self.start_error if self.inner is None else self.inner.dead_reason

    @property
    def restarting(self) -> str | None:
        return None if self.inner is None else self.inner.restarting

    @property
    def num_running(self) -> int:
        return 0 if self.inner is None else self.inner.num_running

    @property
    def num_waiting(self) -> int:
        return 0 if self.inner is None else self.inner.num_waiting

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def cache_stats(self) -> dict | None:
        return None if self.inner is None else self.inner.cache_stats()

    def generate(self, req: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        # NOTE: the engine's own generator, not one wrapping it: a wrapper costs a resume per
        # stream per step (256 a step at production shape)
        return self._refuse(req) if self.inner is None else self.inner.generate(req)

    async def _refuse(self, req: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        reason = self.start_error or "the engine is starting; retry when /health is ok"
        yield RequestOutput(
            req.request_id,
            [],
            "",
            finished=True,
            finish_reason="error",
            error=reason,
            num_prompt_tokens=len(req.prompt_token_ids),
        )

    def abort(self, request_id: str) -> bool:
        return False if self.inner is None else self.inner.abort(request_id)

    def capacity_problem(self, prompt_len: int, max_tokens: int) -> str | None:
        return None if self.inner is None else self.inner.capacity_problem(prompt_len, max_tokens)
