"""AdmissionGate: the engine as the routes see it, saying no cleanly before a request queues.

    draining (SIGTERM)                   -> 503 server_shutting_down
    --max-queued-requests N already wait -> 503 server_overloaded + Retry-After
    more choices (prompts x n) than N    -> 400 request_too_large (they queue at once)
    prompt + max_tokens can never fit    -> 400 request_too_large
    otherwise                            -> the engine's generate(), counted as active

NOTE: the checks run inside generate()'s first step, and the engine queues the request
in that same step (no await in between), so a flood arriving at once cannot slip past
the limit: each arrival sees the queue its predecessors left.
The active count (requests between admission and their last delivery) is what a drain
waits for.
"""

from __future__ import annotations

import asyncio
import logging

from dspark_loop.api.errors import RETRY_AFTER_S, ApiError, retry_after
from dspark_loop.engine.interfaces import EngineClient
from dspark_loop.engine.outputs import GenerateRequest

log = logging.getLogger(__name__)


class AdmissionGate:
    """An EngineClient in front of an EngineClient."""

    def __init__(self, engine: EngineClient, max_queued_requests: int | None = None):
        self.engine = engine
        self.max_queued_requests = max_queued_requests
        self.draining = False
        self.num_active = 0
        self.num_rejected = 0  # 503s for a full queue
        self._idle = asyncio.Event()
        self._idle.set()

    # ---- the engine, as the routes read it -------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.engine.ready

    @property
    def dead_reason(self) -> str | None:
        return self.engine.dead_reason

    @property
    def restarting(self) -> str | None:
        return self.engine.restarting

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting

    def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    def capacity_problem(self, prompt_len: int, max_tokens: int) -> str | None:
        return self.engine.capacity_problem(prompt_len, max_tokens)

    def cache_stats(self) -> dict | None:
        return self.engine.cache_stats()

    # ---- admission ----------------------------------------------------------------------------
    def check(self, g: GenerateRequest) -> None:
        if self.draining:
            raise ApiError(503, "The server is shutting down and takes no new requests.", code="server_shutting_down")
        limit = self.max_queued_requests
        if limit is not None and self.engine.num_waiting >= limit:
            raise self._overloaded(limit)
        problem = self.engine.capacity_problem(len(g.prompt_token_ids), g.params.max_tokens)
        if problem is not None:
            raise ApiError(400, problem, param="max_tokens", code="request_too_large")

    def check_choices(self, count: int, param: str) -> None:
        """An answer of `count` choices (a batch of prompts x n) queues them in one step: more
        than --max-queued-requests can never be admitted (400, naming `param`); more than the
        queue has room for now is one 503 for the whole answer, before any of them queues."""
        limit = self.max_queued_requests
        if limit is None:
            return
        if count > limit:
            raise ApiError(
                400,
                f"This request asks for {count} choices (prompts x n), more than the {limit} requests the "
                f"server queues at once (--max-queued-requests); lower n or send fewer prompts per request.",
                param=param,
                code="request_too_large",
            )
        if self.engine.num_waiting + count > limit:
            raise self._overloaded(limit)

    def _overloaded(self, limit: int) -> ApiError:
        self.num_rejected += 1
        return ApiError(
            503,
            f"The server is overloaded: its queue of {limit} requests is full. Retry after {RETRY_AFTER_S} s.",
            code="server_overloaded",
            headers=retry_after(),
        )

    async def generate(self, g: GenerateRequest):
        self.check(g)
        self.num_active += 1
        self._idle.clear()
        try:
            async for out in self.engine.generate(g):
                yield out
        finally:
            self.num_active -= 1
            if self.num_active == 0:
                self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once no admitted request is active, False if timeout_s passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
